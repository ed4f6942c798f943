"""The epoch's batches, drawn in the main process and shared with every worker.

The plan is pickled, so a worker passes each index to the dataset exactly as the sampler
yielded it. A worker gets a fixed share (batches ``w, w+W, ...``, which torch's round robin
returns in order) or claims batches (``in_order=False``): each batch is claimed exactly once,
and a claim of an earlier generation gets nothing.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import RandomSampler

from ..errors import ConfigError

__all__ = ["EpochPlan", "Lock", "Unbatched", "draw_batches", "draws_from_global", "tell_sampler"]

# Slots of ``EpochPlan.control``.
_COUNT, _GENERATION, _NEXT_CLAIM, _BLOB_BYTES = range(4)


#: a multiprocessing lock (of the context the workers are started with)
Lock = AbstractContextManager[Any]


def draw_batches(
    sampler: Iterable[Any],
    *,
    batched: bool,
    generator: torch.Generator | None,
    draw_seed: bool,
    seed_into: torch.Generator | None,
) -> list[list[Any]]:
    """The epoch's batches from ``sampler`` (of batches when ``batched``, else of indices),
    drawn in torch's order: the sampler's iterator, then, when ``draw_seed``, the workers'
    base seed (``seed_into`` takes the state it was drawn from), then the indices."""
    indices = iter(sampler)
    if draw_seed:
        drawn_from = generator if generator is not None else torch.default_generator
        seed_state = drawn_from.get_state()
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        if seed_into is not None:
            seed_into.set_state(seed_state)
    return [list(batch) for batch in indices] if batched else [[index] for index in indices]


def tell_sampler(
    sampler: object, batch_sampler: object, *, num_workers: int, in_order: bool
) -> None:
    """Tell a sampler with ``set_batching`` (``ShardOrderSampler``) that batch ``k`` is made
    by worker ``k % num_workers`` (one worker without workers, or with ``in_order=False``)."""
    if batch_sampler is not None:  # torch's, around ``sampler``, or the user's
        sampler = getattr(batch_sampler, "sampler", None)
    set_batching = getattr(sampler, "set_batching", None)
    if callable(set_batching):
        batch_size = getattr(batch_sampler, "batch_size", None) or 1
        set_batching(batch_size=batch_size, num_workers=max(1, num_workers) if in_order else 1)


def draws_from_global(sampler: object) -> bool:
    """True if ``sampler`` (or the sampler a batch sampler wraps) shuffles with torch's global
    RNG: then that RNG's state is part of the epoch's resumable state."""
    for candidate in (sampler, getattr(sampler, "sampler", None)):
        if isinstance(candidate, RandomSampler) and candidate.generator is None:
            return True
    return False


@dataclass
class Unbatched:
    """Collate for ``batch_size=None``: the one sample of a planned "batch", converted by the
    loader's ``collate_fn`` as torch does."""

    convert: Callable[[Any], Any]

    def __call__(self, items: list[Any]) -> Any:
        return self.convert(items[0])


def _pickled(batches: Sequence[Sequence[Any]]) -> bytes:
    return pickle.dumps([list(batch) for batch in batches], protocol=pickle.HIGHEST_PROTOCOL)


class EpochPlan:
    """The epoch's batches, pickled into shared memory, read by every worker (persistent ones
    too). ``control``: batch count, generation (one more per :meth:`write`), next batch to
    claim, pickled size."""

    def __init__(self) -> None:
        self.control = torch.zeros(4, dtype=torch.int64).share_memory_()
        self.blob = torch.zeros(0, dtype=torch.uint8).share_memory_()

    @property
    def generation(self) -> int:
        return int(self.control[_GENERATION])

    def write(
        self,
        batches: Sequence[Sequence[Any]],
        *,
        may_grow: bool,
        room: Sequence[Sequence[Any]] = (),
        lock: Lock | None = None,
    ) -> None:
        """Write ``batches`` as the next generation, under the claims' ``lock``; a buffer made
        now has room for ``room`` too. Persistent workers keep their buffer (``may_grow``
        False): then the plan cannot outgrow it."""
        blob = _pickled(batches)
        if len(blob) > self.blob.numel():
            if not may_grow:
                raise ConfigError(
                    "the sampler yields more samples this epoch than in the first one, which "
                    "persistent_workers=True cannot take: use persistent_workers=False"
                )
            # Another epoch's order pickles to about as many bytes, not exactly as many.
            size = max(len(blob), len(_pickled(room)))
            self.blob = torch.zeros(size + size // 4 + 4096, dtype=torch.uint8).share_memory_()
        with lock or nullcontext():
            self.blob[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
            self.control[_BLOB_BYTES] = len(blob)
            self.control[_COUNT] = len(batches)
            self.control[_NEXT_CLAIM] = 0
            self.control[_GENERATION] += 1

    def batches(self) -> list[list[Any]]:
        size = int(self.control[_BLOB_BYTES])
        plan: list[list[Any]] = pickle.loads(self.blob[:size].numpy().tobytes()) if size else []
        return plan

    def claim(self, lock: Lock, generation: int) -> int | None:
        """The next batch no worker has claimed, or None when there is none (or ``generation``
        is not the plan's any more)."""
        with lock:
            control = self.control
            b = int(control[_NEXT_CLAIM])
            if int(control[_GENERATION]) != generation or b >= int(control[_COUNT]):
                return None
            control[_NEXT_CLAIM] = b + 1
            return b
