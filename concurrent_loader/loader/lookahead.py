"""Next-epoch prefetch for persistent workers: the next epoch's first batches are fetched
while this epoch drains, and delivered only if they are the batches the next epoch asks for.

Main process (:func:`predict_next_epoch`). When an epoch's plan is drawn, the next epoch's
plan is drawn too, from copies of the random state it will be drawn from, and written to a
second shared plan (an empty one when no prediction can be made). The prediction is made
only where the next plan is a function of state the loader can copy and put back:

- the batches come from torch's ``SequentialSampler``, ``RandomSampler``,
  ``SubsetRandomSampler`` or ``DistributedSampler`` (exactly these classes, none of their
  subclasses), possibly in torch's ``BatchSampler``, or the loader shards by itself under
  ``torch.distributed``;
- a shuffle draws from a ``torch.Generator`` of the loader or of the sampler, not from
  torch's global RNG (the training step between two epochs draws from that one: dropout,
  say, so a prediction would miss);
- a user's ``DistributedSampler`` is predicted at its epoch plus one (what
  ``set_epoch(epoch + 1)`` before the next epoch gives).

The states of the generators involved and torch's global RNG are put back as they were, so
the prediction changes nothing in the order of the epochs (see :mod:`.state`).

Worker (:class:`Lookahead`). A worker's :class:`~concurrent_loader.pipeline.BatchPipeline`
takes its batches from a :class:`Feed`: its share of the epoch, then its share of the
predicted plan. So once the share is fully started the pipeline goes on with the predicted
batches, within the same ``prefetch_batches`` window and byte budget, while the consumer
drains the epoch. The epoch ends after exactly its own batches; the pipeline is kept (with
its predicted batches in progress) for the next epoch, whose real share is compared, batch
by batch, with the predicted batches started: if they are its first batches, the pipeline
goes on and delivers them; otherwise (``set_epoch``, ``load_state_dict``, a resumed epoch,
a sampler changed by the user...) the kept pipeline is closed (its GETs cancelled, its bytes
released) and the epoch starts a new one: nothing predicted is ever delivered unless it is
exactly the batch asked for.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
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


# ---------------------------------------------------------------------------- main process


def _predictable(sampler: object) -> bool:
    """True if iterating ``sampler`` depends only on state :func:`predict_next_epoch` copies."""
    kind = type(sampler)
    if kind is BatchSampler:
        return _predictable(sampler.sampler)  # type: ignore[attr-defined]
    if kind is SequentialSampler or kind is DistributedSampler:
        return True
    if kind is RandomSampler or kind is SubsetRandomSampler:
        return isinstance(sampler.generator, torch.Generator)  # type: ignore[attr-defined]
    return False


def _at_next_epoch(sampler: Any) -> Any:
    """A copy of a user's ``DistributedSampler`` (or of the batch sampler around one) at its
    next epoch; any other sampler as it is."""
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
    sampler: Iterable[Any],
    *,
    batched: bool,
    users: bool,
    generators: resume.GeneratorStates,
) -> Batches | None:
    """The batches ``sampler`` will yield next epoch, or None when that cannot be predicted.

    ``sampler`` is what the next epoch's batches (``batched``) or indices come from;
    ``users``: it is the user's own (a ``DistributedSampler`` of it is then predicted at its
    next epoch). Every random state drawn from is restored.
    """
    if not _predictable(sampler):
        return None
    if users:
        sampler = _at_next_epoch(sampler)
    states = generators.get()
    global_state = torch.get_rng_state()
    try:
        if batched:
            return [list(batch) for batch in sampler]
        return [[index] for index in sampler]
    finally:
        generators.set(states)
        torch.set_rng_state(global_state)


# ---------------------------------------------------------------------------- worker


class Feed:
    """The batches a pipeline starts, taken one at a time: the share of this epoch, then the
    predicted share of the next one (recorded as ``guessed`` as they are taken)."""

    def __init__(self, share: Sequence[list[Any]], predicted: Sequence[list[Any]]) -> None:
        self._share = deque(share)
        self._predicted = deque(predicted)
        self.guessed: Batches = []

    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> list[Any]:
        if self._share:
            return self._share.popleft()
        if self._predicted:
            batch = self._predicted.popleft()
            self.guessed.append(batch)
            return batch
        raise StopIteration

    def follows(self, share: Sequence[list[Any]]) -> bool:
        """True if the guessed batches are exactly the first batches of ``share``: the same
        indices, of the same types, in the same order."""
        guessed = self.guessed
        return len(share) >= len(guessed) and all(
            len(real) == len(guess) and all(map(_same, real, guess))
            for real, guess in zip(share, guessed, strict=False)
        )

    def next_epoch(self, share: Sequence[list[Any]], predicted: Sequence[list[Any]]) -> None:
        """The guessed batches were the first of ``share``: go on with the rest of it."""
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
    while its predicted batches are the ones asked for. ``hits`` and ``misses`` count the
    epochs that used, or dropped, the predicted batches in progress."""

    def __init__(self) -> None:
        self._pipeline: BatchPipeline | None = None
        self._outcomes: Generator[Any, None, None] | None = None
        self._feed: Feed | None = None
        self.hits = 0
        self.misses = 0

    @property
    def holding(self) -> int:
        """Predicted batches started and kept for the next epoch."""
        return len(self._feed.guessed) if self._pipeline is not None and self._feed else 0

    def epoch(
        self,
        share: Sequence[list[Any]],
        predicted: Sequence[list[Any]],
        start: Callable[[Feed], BatchPipeline],
    ) -> Generator[Any, None, None]:
        """Yield exactly one outcome per batch of ``share``, in order: the batch, or a
        :class:`~concurrent_loader.pipeline.Failure` (for every batch left when the pipeline
        broke or could not start). ``start(feed)`` makes a new pipeline.

        On a normal end with predicted batches in progress, the pipeline is kept for the next
        call; otherwise (also on ``close()`` of this generator) it is closed.
        """
        pipeline, outcomes, feed = self._pipeline, self._outcomes, self._feed
        self._pipeline = self._outcomes = self._feed = None
        if pipeline is not None and outcomes is not None and feed is not None:
            if feed.follows(share):
                self.hits += 1
                feed.next_epoch(share, predicted)
            else:
                self.misses += 1
                log.debug("next-epoch prefetch missed: dropping %d batches", len(feed.guessed))
                outcomes.close()
                pipeline.close()
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
                if outcomes is not None:
                    outcomes.close()
                if pipeline is not None:
                    pipeline.close()
        if keep:
            self._pipeline, self._outcomes, self._feed = pipeline, outcomes, feed
        for _ in range(len(share) - yielded):
            # torch's round robin over the workers counts on one outcome per batch.
            yield Failure(broken or RuntimeError("the batch pipeline ended early"))

    def close(self) -> None:
        """Drop what is kept (at the end of the worker)."""
        pipeline, outcomes = self._pipeline, self._outcomes
        self._pipeline = self._outcomes = self._feed = None
        if outcomes is not None:
            outcomes.close()
        if pipeline is not None:
            pipeline.close()
