"""The epoch's batches, drawn in the main process and shared with every worker.

Plain ``int`` indices are kept as two int64 tensors, anything else pickled, so a worker
passes each index to the dataset exactly as the sampler yielded it. A worker gets a fixed
share (batches ``w, w+W, ...``, which torch's round robin returns in order) or claims
batches (``in_order=False``): each batch is claimed exactly once, and a claim of an earlier
generation gets nothing.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
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
    if batched:
        return [list(batch) for batch in indices]
    return [[index] for index in indices]


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


class Unbatched:
    """Collate for ``batch_size=None``: the one sample of a planned "batch", converted by the
    loader's ``collate_fn`` as torch does."""

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        self.convert = convert

    def __call__(self, items: list[Any]) -> Any:
        return self.convert(items[0])


def _all_ints(batches: Sequence[Sequence[Any]]) -> bool:
    # ``type(...) is int``: a bool, numpy integer or 0-d tensor reaches the dataset as it is.
    return all(type(i) is int for batch in batches for i in batch)


def _fits(need: tuple[int, int, int], have: tuple[int, int, int]) -> bool:
    return all(n <= h for n, h in zip(need, have, strict=True))


class EpochPlan:
    """The epoch's batches in shared memory, read by every worker (persistent ones too).
    ``control``: batch count, generation (one more per :meth:`write`), next batch to claim,
    pickled size; int batch ``b`` is ``indices[offsets[b]:offsets[b+1]]``, others ``blob``."""

    def __init__(self) -> None:
        self.control = torch.zeros(4, dtype=torch.int64).share_memory_()
        self.indices = torch.zeros(0, dtype=torch.int64).share_memory_()
        self.offsets = torch.zeros(1, dtype=torch.int64).share_memory_()
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
        """Write ``batches`` as the next generation, under the claims' ``lock``; buffers made
        now are sized for at least ``room`` batches too. Persistent workers keep their buffers
        (``may_grow`` False): then the plan cannot outgrow them."""
        have = (self.indices.numel(), self.offsets.numel(), self.blob.numel())
        ints = _all_ints(batches)
        if ints:
            flat = [i for batch in batches for i in batch]
            need = (len(flat), len(batches) + 1, 0)
            # Buffers made for a pickled plan (persistent workers) take an int plan pickled.
            ints = may_grow or _fits(need, have)
        if ints:
            blob = b""
            want = (
                max(len(flat), sum(len(b) for b in room)),
                max(len(batches), len(room)) + 1,
                0,
            )
        else:
            flat = []
            blob = pickle.dumps([list(b) for b in batches], protocol=pickle.HIGHEST_PROTOCOL)
            # Another epoch's order pickles to about as many bytes, not exactly as many.
            size = max(len(blob), len(pickle.dumps([list(b) for b in room])) if room else 0)
            need = (0, 1, len(blob))
            want = (0, 1, size + size // 4 + 4096)
        if not _fits(need, have):
            if not may_grow:
                raise ConfigError(
                    "the sampler yields more samples this epoch than in the first one, which "
                    "persistent_workers=True cannot take: use persistent_workers=False"
                )
            sizes = [max(n, h) for n, h in zip(want, have, strict=True)]
            self.indices = torch.zeros(sizes[0], dtype=torch.int64).share_memory_()
            self.offsets = torch.zeros(sizes[1], dtype=torch.int64).share_memory_()
            self.blob = torch.zeros(sizes[2], dtype=torch.uint8).share_memory_()
        with lock or nullcontext():
            self._fill(batches, flat, blob)

    def _fill(self, batches: Sequence[Sequence[Any]], flat: list[int], blob: bytes) -> None:
        if blob:
            self.blob[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        else:
            sizes = torch.tensor([len(b) for b in batches], dtype=torch.int64)
            self.offsets[0] = 0
            torch.cumsum(sizes, 0, out=self.offsets[1 : len(batches) + 1])
            self.indices[: len(flat)] = torch.tensor(flat, dtype=torch.int64)
        self.control[_BLOB_BYTES] = len(blob)
        self.control[_COUNT] = len(batches)
        self.control[_NEXT_CLAIM] = 0
        self.control[_GENERATION] += 1

    def batches(self) -> list[list[Any]]:
        blob_bytes = int(self.control[_BLOB_BYTES])
        if blob_bytes:
            plan: list[list[Any]] = pickle.loads(self.blob[:blob_bytes].numpy().tobytes())
            return plan
        count = int(self.control[_COUNT])
        offsets = self.offsets[: count + 1].tolist()
        indices = self.indices[: offsets[-1]].tolist() if count else []
        return [indices[offsets[b] : offsets[b + 1]] for b in range(count)]

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
