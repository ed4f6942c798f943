"""What a loader's processes tuned for themselves: requests in flight
(:mod:`concurrent_loader.fetch.tuning`) and decode threads
(:mod:`concurrent_loader.pipeline.threads`), each the mean over processes of what each last
published. Processes that start later (the next epoch's workers, Ray actors) start where
these ended, and ``state_dict()["tuning"]`` carries them into a resumed job."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config import FetchConfig
from ..errors import ConfigError
from ..metrics import SharedStats
from ..pipeline import PipelineOptions

__all__ = ["Tuned"]

_KEYS = ("inflight_limit", "decode_threads")


class Tuned:
    def __init__(
        self,
        options: PipelineOptions,
        fetch_config: FetchConfig | None,
        stats: SharedStats,
        processes: int,
    ) -> None:
        self.options = options
        self._fetch_config = fetch_config
        self._stats = stats
        self._processes = max(1, processes)
        self._loaded: dict[str, int] = {}

    def _mean(self, counter: str) -> int | None:
        """Over the processes that published it (others are starting), else as loaded."""
        mean = self._stats.published_mean(counter)
        return max(1, round(mean)) if mean else self._loaded.get(counter)

    def inflight_limit(self) -> int | None:
        """None when the dataset's limit is pinned, or the dataset is not ours."""
        config = self._fetch_config
        if config is None or config.max_inflight_requests is not None:
            return None
        return self._mean("inflight_limit")

    def decode_threads(self) -> int:
        """Per process now: the pinned count, or the tuned one (within its most)."""
        most = self.options.max_decode_threads
        if most is None:
            return self.options.decode_threads
        return min(self._mean("decode_threads") or self.options.decode_threads, most)

    def slots(self) -> tuple[int, int]:
        """(fetch slots, decode threads) over every process: each process's value now, or
        what it starts with."""
        config = self._fetch_config
        if config is None:  # not ours: __getitem__ calls on getitem_threads threads
            inflight = self.options.getitem_threads
        else:
            inflight = self.inflight_limit() or config.inflight_start
        return inflight * self._processes, self.decode_threads() * self._processes

    def next_options(self) -> PipelineOptions:
        """The options of processes that start now: where the running ones' tuning is."""
        return replace(
            self.options,
            inflight_start=self.inflight_limit(),
            decode_threads=self.decode_threads(),
        )

    def state(self) -> dict[str, int | None]:
        """What a resumed job starts from (None: pinned, nothing to carry)."""
        tuned = self.options.max_decode_threads is not None
        return {
            "inflight_limit": self.inflight_limit(),
            "decode_threads": self.decode_threads() if tuned else None,
        }

    def load(self, state: dict[str, Any]) -> None:
        """Take a saved state's tuning (checked: ``ConfigError`` naming what is wrong)."""
        tuning = state.get("tuning", {})
        if not isinstance(tuning, dict):
            raise ConfigError(f"the loader state's 'tuning' must be a dict, got {tuning!r}")
        loaded = {}
        for key in _KEYS:
            value = tuning.get(key)
            if value is None:
                continue
            if type(value) is not int or value < 1:
                raise ConfigError(
                    f"the loader state's tuning[{key!r}] must be an int >= 1, got {value!r}"
                )
            loaded[key] = value
        self._loaded = loaded
