"""Next-epoch prefetch for persistent workers: the next epoch's first batches are fetched
while this epoch drains, and delivered only if they are exactly the batches it asks for.

:func:`predict_next_epoch` (main process) draws the next plan from copies of its random
state, only for exactly torch's ``SequentialSampler``, ``RandomSampler``,
``SubsetRandomSampler`` or ``DistributedSampler`` (a user's at its epoch plus one), perhaps
in torch's ``BatchSampler``, shuffling with a ``torch.Generator``. Every random state is
restored, so prediction changes no epoch's order.

:class:`Lookahead` (worker) feeds its pipeline the epoch's share, then the predicted share;
the pipeline is kept for the next epoch only if its predicted batches are that epoch's
first ones, else closed.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
)

from ..pipeline import BatchPipeline, Failure
from . import state as resume

__all__ = ["Feed", "Lookahead", "predict_next_epoch"]

log = logging.getLogger(__name__)

Batches = list[list[Any]]


def _predictable(sampler: object) -> bool:
    kind = type(sampler)
    if kind is BatchSampler:
        return _predictable(sampler.sampler)  # type: ignore[attr-defined]
    if kind is SequentialSampler or kind is DistributedSampler:
        return True
    if kind is RandomSampler or kind is SubsetRandomSampler:
        return isinstance(sampler.generator, torch.Generator)  # type: ignore[attr-defined]
    return False


def _at_next_epoch(sampler: Any) -> Any:
    ahead: Any
    if type(sampler) is DistributedSampler:
        ahead = copy.copy(sampler)
        ahead.set_epoch(sampler.epoch + 1)
        return ahead
    if type(sampler) is BatchSampler and type(sampler.sampler) is DistributedSampler:
        ahead = copy.copy(sampler)
        ahead.sampler = _at_next_epoch(sampler.sampler)
        return ahead
    return sampler


def predict_next_epoch(
    sampler: Iterable[Any], *, batched: bool, users: bool, generators: resume.GeneratorStates
) -> Batches:
    """The batches ``sampler`` (of batches when ``batched``) yields next epoch, or none when
    that cannot be predicted; ``users``: it is the user's own. Every random state drawn from
    is restored."""
    if not _predictable(sampler):
        return []
    if users:
        sampler = _at_next_epoch(sampler)
    states = generators.get()
    global_state = torch.get_rng_state()
    try:
        return [list(batch) for batch in sampler] if batched else [[index] for index in sampler]
    finally:
        generators.set(states)
        torch.set_rng_state(global_state)


class Feed(Iterator[list[Any]]):
    """The batches a pipeline starts, taken one at a time: the share of this epoch, then the
    predicted share of the next one (recorded as ``guessed`` as they are taken)."""

    def __init__(self, share: Sequence[list[Any]], predicted: Sequence[list[Any]]) -> None:
        self._share = deque(share)
        self._predicted = deque(predicted)
        self.guessed: Batches = []

    def __next__(self) -> list[Any]:
        if self._share:
            return self._share.popleft()
        if self._predicted:
            batch = self._predicted.popleft()
            self.guessed.append(batch)
            return batch
        raise StopIteration

    def follows(self, share: Sequence[list[Any]]) -> bool:
        """True if the guessed batches are exactly the first batches of ``share`` (the same
        indices, of the same types)."""
        guessed = self.guessed
        return len(share) >= len(guessed) and all(
            len(real) == len(guess) and all(map(_same, real, guess))
            for real, guess in zip(share, guessed, strict=False)
        )

    def next_epoch(self, share: Sequence[list[Any]], predicted: Sequence[list[Any]]) -> None:
        self._share = deque(share[len(self.guessed) :])
        self._predicted = deque(predicted)
        self.guessed = []


def _same(real: Any, guess: Any) -> bool:
    if type(real) is not type(guess):
        return False  # 1 == 1.0 == True, but a dataset may tell them apart
    try:
        return bool(real == guess)
    except Exception:  # no single truth value (an array): not known to be the same
        return False


class Lookahead:
    """One worker's batches, epoch after epoch, from a pipeline kept from one epoch to the next
    while its predicted batches are the ones asked for (else dropped)."""

    def __init__(self) -> None:
        self._pipeline: BatchPipeline | None = None
        self._outcomes: Generator[Any, None, None] | None = None
        self._feed: Feed | None = None

    def epoch(
        self,
        share: Sequence[list[Any]],
        predicted: Sequence[list[Any]],
        start: Callable[[Feed], BatchPipeline],
    ) -> Generator[Any, None, None]:
        """Exactly one outcome per batch of ``share``, in order: the batch, or a ``Failure`` (for
        every batch left once the pipeline broke); ``start(feed)`` makes a pipeline, kept for
        the next call only after a normal end with predicted batches in progress."""
        pipeline, outcomes, feed = self._pipeline, self._outcomes, self._feed
        self._pipeline = self._outcomes = self._feed = None
        if pipeline is not None and outcomes is not None and feed is not None:
            if feed.follows(share):
                feed.next_epoch(share, predicted)
            else:
                log.debug("next-epoch prefetch missed: dropping %d batches", len(feed.guessed))
                _close(outcomes, pipeline)
                pipeline = outcomes = feed = None
        yielded, keep = 0, False
        broken: BaseException | None = None
        try:
            if not share:
                return
            if pipeline is None or outcomes is None or feed is None:
                feed = Feed(share, predicted)
                pipeline = start(feed)
                outcomes = pipeline.outcomes()
            for outcome in outcomes:
                yield outcome
                yielded += 1
                if yielded == len(share):
                    break
            broken = pipeline.broken
            keep = yielded == len(share) and bool(feed.guessed) and broken is None
        except Exception as exc:  # the pipeline could not start
            broken = exc
        finally:
            if not keep:
                _close(outcomes, pipeline)
        if keep:
            self._pipeline, self._outcomes, self._feed = pipeline, outcomes, feed
        for _ in range(len(share) - yielded):
            # torch's round robin over the workers counts on one outcome per batch.
            yield Failure(broken or RuntimeError("the batch pipeline ended early"))

    def close(self) -> None:
        _close(self._outcomes, self._pipeline)
        self._pipeline = self._outcomes = self._feed = None


def _close(outcomes: Generator[Any, None, None] | None, pipeline: BatchPipeline | None) -> None:
    if outcomes is not None:
        outcomes.close()
    if pipeline is not None:
        pipeline.close()
