"""How a process produces batches, validated once (``ConfigError``); the defaults derived
in one place. How bytes are fetched is the dataset's (``FetchConfig``, ``PartsConfig``).

No silent hang: :class:`StallWatch` waits on a future, logs a WARNING after each slice
without progress and, after ``timeout_s``, raises ``LoaderStalled`` naming what the process
waited for (``describe()``) with every thread's Python stack."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import FetchConfig, check_count
from ..errors import ConfigError, LoaderStalled, Reason
from ..fetch.parts import PartsConfig

__all__ = ["PipelineOptions", "StallWatch", "available_cpus", "cores", "worker_count"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineOptions:
    """Per process: ``decode_threads`` (our datasets; with ``max_decode_threads``, the
    first of a self-tuned count, :mod:`.threads`), ``getitem_threads`` (a foreign
    dataset's ``__getitem__``), ``prefetch_batches`` (in progress ahead of the consumer;
    with ``follow_limit``, more while a self-tuned fetch limit has grown past them),
    ``inflight_start`` (a self-tuned fetch limit's first value where this process opens its
    client: what an earlier epoch's processes ended with; None: ``FetchConfig``'s),
    ``on_error`` (``"raise"`` or ``"skip"``), ``stall_timeout_s`` (None: never; a WARNING every
    fifth of it, at most every minute, before), ``parts`` (the dataset's ``PartsConfig``)."""

    decode_threads: int = 1
    max_decode_threads: int | None = None
    getitem_threads: int = 64
    prefetch_batches: int = 2
    follow_limit: bool = False
    inflight_start: int | None = None
    on_error: str = "raise"
    stall_timeout_s: float | None = 300.0
    parts: PartsConfig = field(default_factory=PartsConfig)

    def __post_init__(self) -> None:
        if self.stall_timeout_s is not None and not self.stall_timeout_s > 0:
            raise ConfigError(f"stall_timeout_s must be > 0 or None, got {self.stall_timeout_s}")
        for name in ("decode_threads", "getitem_threads", "prefetch_batches"):
            check_count(name, getattr(self, name))
        if self.inflight_start is not None:
            check_count("inflight_start", self.inflight_start)
        if self.max_decode_threads is not None and self.max_decode_threads < self.decode_threads:
            raise ConfigError(
                f"max_decode_threads ({self.max_decode_threads}) is below decode_threads "
                f"({self.decode_threads})"
            )
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")

    @classmethod
    def derive(
        cls,
        *,
        fetch_config: FetchConfig | None,
        batch_size: int,
        num_workers: int,
        decode_threads: int | str | None = None,
        getitem_threads: int | None = None,
        prefetch_batches: int | str | None = None,
        cpu_budget: float | None = None,
        on_error: str = "raise",
        stall_timeout_s: float | None = 300.0,
        parts: PartsConfig | None = None,
    ) -> PipelineOptions:
        """Fill what the user left out (None or ``"auto"``): decode threads self-tuned between
        1 and this process's share of ``cpu_budget`` cores (default: the CPUs this process may
        use), starting at that share rounded down (at most 8); batches in progress = enough to
        keep ``fetch_config.inflight_start`` GETs (64 for a dataset that is not ours) busy,
        plus one (at least 2), and with a self-tuned fetch limit, as many more as keep the
        limit busy while it grows."""
        inflight = fetch_config.inflight_start if fetch_config is not None else 64
        share = cores(cpu_budget) / max(1, num_workers)
        max_decode_threads = None
        if decode_threads in (None, "auto"):
            decode_threads = max(1, min(8, int(share)))
            if fetch_config is not None:  # our dataset: decoded on these threads
                max_decode_threads = max(decode_threads, math.ceil(share))
        if prefetch_batches == "auto":
            prefetch_batches = None
        if isinstance(decode_threads, str) or isinstance(prefetch_batches, str):
            raise ConfigError(
                "decode_threads and prefetch_batches take a count, None or 'auto', "
                f"got {decode_threads!r} and {prefetch_batches!r}"
            )
        follow_limit = False
        if prefetch_batches is None:
            prefetch_batches = max(2, -(-inflight // max(1, batch_size)) + 1)
            follow_limit = fetch_config is not None and fetch_config.max_inflight_requests is None
        return cls(
            decode_threads=decode_threads,
            max_decode_threads=max_decode_threads,
            getitem_threads=getitem_threads if getitem_threads is not None else 64,
            prefetch_batches=prefetch_batches,
            follow_limit=follow_limit,
            on_error=on_error,
            stall_timeout_s=stall_timeout_s,
            parts=parts if parts is not None else PartsConfig(),
        )


def cores(cpu_budget: float | None) -> float:
    """The cores a loader may use: ``cpu_budget``, checked, or by default the CPUs this
    process may use shared among the node's ranks (torchrun's ``LOCAL_WORLD_SIZE``; ranks
    already pinned to their own cores, or launched without it, should pass ``cpu_budget``)."""
    if cpu_budget is None:
        ranks = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        return available_cpus() / max(1, int(ranks) if ranks.isdecimal() else 1)
    if isinstance(cpu_budget, bool) or not (
        isinstance(cpu_budget, int | float) and 0 < cpu_budget < math.inf
    ):
        raise ConfigError(f"cpu_budget must be a number of cores > 0, got {cpu_budget!r}")
    return cpu_budget


def worker_count(num_workers: int | str, cpu_budget: float | None) -> int:
    """torch's ``num_workers``, or for ``"auto"`` a worker process per core of the budget (at
    least one): processes, not threads, share the cores (each process's decode threads then
    have a share of one core)."""
    if num_workers == "auto":
        return max(1, int(cores(cpu_budget)))
    if isinstance(num_workers, str):
        raise ConfigError(f"num_workers takes a count or 'auto', got {num_workers!r}")
    return num_workers


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class StallWatch:
    """Waits that warn after ``warn_s`` and fail after ``timeout_s`` (None: never), saying
    what ``describe()`` says is in progress."""

    def __init__(self, timeout_s: float | None, *, where: str) -> None:
        self.timeout_s = timeout_s
        self.warn_s = min(60.0, timeout_s / 5) if timeout_s else 60.0
        self.where = where
        self.describe: Callable[[], str] = lambda: ""

    def wait(self, future: concurrent.futures.Future[Any], what: str) -> None:
        waited = 0.0
        while True:
            step = self.warn_s
            if self.timeout_s is not None:
                step = min(step, self.timeout_s - waited)
            try:
                future.exception(timeout=step)
                return
            except concurrent.futures.TimeoutError:
                waited += step
            except concurrent.futures.CancelledError:
                return
            state = self.describe()
            if self.timeout_s is not None and waited >= self.timeout_s:
                raise LoaderStalled(
                    f"{self.where} (pid {os.getpid()}) waited {waited:.1f} s for {what}; "
                    f"{state}\n{_thread_stacks()}",
                    stage="loader",
                    cause=Reason.STALLED,
                )
            log.warning(
                "%s (pid %d) has waited %.1f s for %s; %s",
                self.where,
                os.getpid(),
                waited,
                what,
                state,
            )


def _thread_stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(
        f"thread {names.get(ident, '?')} ({ident}):\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
    )
