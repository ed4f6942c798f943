"""Batches made on Ray actors: ``ConcurrentDataLoader(..., executor=RayExecutor(...))``.

The trainer keeps the sampler and the epoch's plan (order, resume, the skip policy, pinning
and the GPU copy); only batch descriptors (the epoch's base seed, the batch's number and its
indices) go to the actors, which run the process pipeline (:mod:`.actor`) and return collated
batches through Ray's object store. Invariants of :meth:`RayWorkers.epoch`:

- outcome ``b`` is the plan's batch ``b``, in order, each exactly once: results are put back
  in plan order, and a batch is delivered only from the call that returned it;
- at most ``max_batches_in_flight`` batches are sent and not yet delivered; a batch goes to
  the live actor with the fewest batches in flight, so a slow actor holds back at most the
  batches it was given;
- an actor that dies (``ray.kill``, a lost node, the OS) is replaced, and each batch it held
  (or whose finished result was lost with its node) is sent again to the live actors, up to
  ``max_attempts`` runs in all; past that the batch's outcome is a ``WorkerError``; an actor
  that fails as it starts is a ``WorkerError`` for every batch, without replacements;
- leaving an epoch early cancels its calls still queued; :meth:`RayWorkers.close` (or the
  pool being collected) kills every actor it made, and shuts Ray down only if it started it.
"""

from __future__ import annotations

import importlib.util
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from ..config import check_count
from ..errors import ConfigError, Reason, WorkerError
from ..metrics import SharedStats, StageStats
from ..pipeline import Failure, Partial, PipelineOptions
from .actor import PrepActor, unship
from .iterator import pin

__all__ = ["RayExecutor", "RayWorkers"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayExecutor:
    """Make batches on ``actors`` Ray actors of ``cpus_per_actor`` CPUs each, on the cluster
    at ``address`` (None: the Ray this process already joined, else a new local one), with at
    most ``max_batches_in_flight`` batches in progress (None: ``prefetch_batches`` per actor);
    a batch runs on at most ``max_attempts`` actors (one more each time its actor dies)."""

    actors: int = 2
    cpus_per_actor: float = 1.0
    address: str | None = None
    max_batches_in_flight: int | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        check_count("actors", self.actors)
        check_count("max_attempts", self.max_attempts)
        if self.max_batches_in_flight is not None:
            check_count("max_batches_in_flight", self.max_batches_in_flight)
        if isinstance(self.cpus_per_actor, bool) or not self.cpus_per_actor > 0:
            raise ConfigError(f"cpus_per_actor must be > 0, got {self.cpus_per_actor!r}")
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "RayExecutor needs Ray, which is not installed: "
                "pip install 'concurrent-loader[ray]'"
            )

    def window(self, options: PipelineOptions) -> int:
        if self.max_batches_in_flight is not None:
            return self.max_batches_in_flight
        return self.actors * options.prefetch_batches


@dataclass
class _Actor:
    handle: Any
    row: int  # its row of the counters (an actor that replaces another takes its row)
    in_flight: int = 0
    alive: bool = True
    counted: int = 0  # the calls ended when the counters last written were taken


def _kill(ray: Any, actors: list[_Actor], started_ray: bool) -> None:
    if not ray.is_initialized():
        return
    for actor in actors:
        try:
            ray.kill(actor.handle)
        except Exception as exc:  # already gone with its node
            log.debug("killing a Ray actor: %s", exc)
    actors.clear()
    if started_ray:
        ray.shutdown()


class RayWorkers:
    """The live actors of one loader: made when its first epoch starts, kept across epochs."""

    def __init__(
        self,
        executor: RayExecutor,
        dataset: Dataset[Any],
        collate_fn: Callable[[list[Any]], Any],
        options: PipelineOptions,
        stats: SharedStats,
        worker_init_fn: Callable[[int], None] | None,
    ) -> None:
        import ray

        self._ray = ray
        started_ray = not ray.is_initialized()
        if started_ray:
            if executor.address is None:
                ray.init(include_dashboard=False)
            else:
                ray.init(address=executor.address)
        self._executor = executor
        self._window = executor.window(options)
        self._stats = stats
        # Spread over the nodes: more nodes' CPUs and network links per trainer.
        self._actor_class = ray.remote(PrepActor).options(
            num_cpus=executor.cpus_per_actor,
            max_concurrency=self._window,
            scheduling_strategy="SPREAD",
        )
        # Sent once: each actor gets the dataset and its settings by reference.
        self._setup = ray.put((dataset, collate_fn, options, worker_init_fn))
        self._actors: list[_Actor] = []  # the live ones
        self._start_failed: WorkerError | None = None
        self._finalizer = weakref.finalize(self, _kill, ray, self._actors, started_ray)
        for row in range(executor.actors):
            self._actors.append(self._start(row))

    def _start(self, row: int) -> _Actor:
        vector = self._stats.read(row).vector()
        return _Actor(self._actor_class.remote(self._setup, vector, row), row)

    @property
    def actors(self) -> list[Any]:
        """The handles of the live actors."""
        return [actor.handle for actor in self._actors]

    def epoch(self, batches: Sequence[Sequence[Any]], seed: int, pin_memory: bool) -> Iterator[Any]:
        """The outcomes of ``batches``, in order (the batch, a ``Partial`` or a ``Failure``)."""
        ray = self._ray
        in_flight: dict[Any, tuple[int, _Actor]] = {}
        done: dict[int, Any] = {}
        runs = [0] * len(batches)
        sent = delivered = 0

        def send(number: int) -> None:
            if not self._actors:  # every actor failed to start
                done[number] = Failure(self._start_failed or WorkerError("no Ray actor"))
                return
            actor = min(self._actors, key=lambda a: a.in_flight)
            runs[number] += 1
            actor.in_flight += 1
            ref = actor.handle.run.remote(seed, number, list(batches[number]))
            in_flight[ref] = (number, actor)

        try:
            while delivered < len(batches):
                while sent < len(batches) and sent - delivered < self._window:
                    send(sent)
                    sent += 1
                while delivered not in done:
                    (ref,), _ = ray.wait(list(in_flight), num_returns=1)
                    number, actor = in_flight.pop(ref)
                    actor.in_flight -= 1
                    try:
                        outcome, calls_ended, vector = ray.get(ref)
                    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                        # The actor died, or the node holding its finished batch did.
                        if isinstance(exc, ray.exceptions.RayActorError):
                            self._lost(actor, exc)
                        if self._start_failed is not None:
                            done[number] = Failure(self._start_failed)
                        elif runs[number] < self._executor.max_attempts:
                            send(number)
                        else:
                            done[number] = Failure(_gave_up(number, runs[number], exc))
                        continue
                    except ray.exceptions.RayTaskError as exc:  # this module's own failure
                        done[number] = Failure(exc.cause if exc.cause is not None else exc)
                        continue
                    if calls_ended > actor.counted:
                        actor.counted = calls_ended
                        self._stats.write(actor.row, StageStats(vector))
                    done[number] = unship(outcome)
                outcome = done.pop(delivered)
                delivered += 1
                if pin_memory and not isinstance(outcome, Failure | Partial):
                    outcome = pin(outcome)
                yield outcome
        finally:
            for ref, (_, actor) in in_flight.items():  # an epoch left early
                actor.in_flight -= 1
                try:  # what is still queued need not run
                    ray.cancel(ref)
                except Exception as exc:
                    log.debug("cancelling a Ray call: %s", exc)

    def _lost(self, actor: _Actor, exc: BaseException) -> None:
        if not actor.alive:
            return
        actor.alive = False
        self._actors.remove(actor)
        if getattr(exc, "actor_init_failed", False):
            # The dataset, collate function or worker_init_fn fails in an actor: so would it
            # in the next one.
            error = WorkerError(
                f"a Ray actor could not start: {exc}", stage="worker", cause=Reason.WORKER_DIED
            )
            error.__cause__ = exc
            self._start_failed = error
            return
        log.warning("Ray actor %d died (%s); its batches run again on the others", actor.row, exc)
        self._actors.append(self._start(actor.row))

    def close(self) -> None:
        """Kill the actors (and shut Ray down if this pool started it); idempotent."""
        self._finalizer()


def _gave_up(number: int, runs: int, exc: BaseException) -> WorkerError:
    error = WorkerError(
        f"batch {number} of the epoch was lost with each of the {runs} Ray actors that ran it",
        stage="worker",
        cause=Reason.WORKER_DIED,
    )
    error.__cause__ = exc
    return error


def base_seed(generator: torch.Generator) -> int:
    """The workers' base seed, drawn from ``generator`` as torch's iterator draws it."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
