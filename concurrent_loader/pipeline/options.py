"""How a process produces batches, validated once (``ConfigError``); the defaults derived
in one place. How bytes are fetched is the dataset's (``FetchConfig``, ``PartsConfig``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import FetchConfig, check_count
from ..errors import ConfigError
from ..fetch.parts import PartsConfig

__all__ = ["PipelineOptions", "available_cpus"]


@dataclass(frozen=True)
class PipelineOptions:
    """Per process: ``decode_threads`` (our datasets), ``getitem_threads`` (a foreign
    dataset's ``__getitem__``), ``prefetch_batches`` (in progress ahead of the consumer),
    ``on_error`` (``"raise"`` or ``"skip"``), ``stall_timeout_s`` (None: never; a WARNING every
    fifth of it, at most every minute, before), ``parts`` (the dataset's ``PartsConfig``)."""

    decode_threads: int = 1
    getitem_threads: int = 64
    prefetch_batches: int = 2
    on_error: str = "raise"
    stall_timeout_s: float | None = 300.0
    parts: PartsConfig = field(default_factory=PartsConfig)

    def __post_init__(self) -> None:
        if self.stall_timeout_s is not None and not self.stall_timeout_s > 0:
            raise ConfigError(f"stall_timeout_s must be > 0 or None, got {self.stall_timeout_s}")
        for name in ("decode_threads", "getitem_threads", "prefetch_batches"):
            check_count(name, getattr(self, name))
        if not isinstance(self.parts, PartsConfig):
            raise ConfigError(f"parts must be a PartsConfig, got {type(self.parts).__name__}")
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")

    @classmethod
    def derive(
        cls,
        *,
        fetch_config: FetchConfig | None,
        batch_size: int,
        num_workers: int,
        decode_threads: int | None = None,
        getitem_threads: int | None = None,
        prefetch_batches: int | None = None,
        on_error: str = "raise",
        stall_timeout_s: float | None = 300.0,
        parts: PartsConfig | None = None,
    ) -> PipelineOptions:
        """Fill what the user left out: decode threads = this process's share of the CPUs
        (at most 8); batches in progress = enough to keep ``fetch_config.inflight_cap`` GETs
        (64 for a dataset that is not ours) busy, plus one (at least 2)."""
        inflight = fetch_config.inflight_cap if fetch_config is not None else 64
        if decode_threads is None:
            decode_threads = max(1, min(8, available_cpus() // max(1, num_workers)))
        if prefetch_batches is None:
            prefetch_batches = max(2, -(-inflight // max(1, batch_size)) + 1)
        return cls(
            decode_threads=decode_threads,
            getitem_threads=getitem_threads if getitem_threads is not None else 64,
            prefetch_batches=prefetch_batches,
            on_error=on_error,
            stall_timeout_s=stall_timeout_s,
            parts=parts if parts is not None else PartsConfig(),
        )


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
