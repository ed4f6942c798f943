"""The data-stall model behind ``concurrent-loader analyze``: stage rates measured apart ->
the loader's rate at given settings, the share of step time a training loop would wait,
and the settings to use.

The model (every rate in samples/s; a "setting" is W workers, T decode threads each and c
requests in flight each, on C cores):

- ingest at N requests in flight over every process: the fetch-only rate measured in one
  process at N in flight, linearly interpolated between the settings measured (from 0 at 0)
  and flat beyond the largest (no extrapolation past what the storage was seen to give);
  N = W * c;
- decode: ``decode(max(W, 1) * T)``, where ``decode(n)`` is the rate of n threads of one
  process on bytes already in memory, measured from 1 to C (interpolated as above, flat past
  C). The decoders release the GIL, so n threads decode about what n processes do, and
  the curve holds what the cores really give: on a machine whose cores are busy with other
  work (or with a storage server on the same node), two decoders are not twice one;
- the loader: ``efficiency(W, T) * min(ingest, decode)``; ``efficiency(W, T)`` is
  ``measured / min(ingest, decode)`` of W workers x T threads measured end to end (the
  median if measured more than once), at most 1: what the stages alone do not see
  (collation, the hand-off to the main process, epoch starts, each process's own work; on a
  machine whose cores also serve the storage, one setting reached 0.76 of the slower stage
  where another reached 1.0, so one share for all settings missed by up to 30 %). For a
  setting not measured: the median share of the nearest worker count measured (the larger
  on a tie);
- with a node cache holding a share ``h`` of the dataset: ingest becomes
  ``1 / ((1 - h) / ingest + h / cache_rate)`` (``cache_rate``: the fetch-only rate of
  hits; hits cost nothing when it was not measured);
- the stall share of a step consuming ``step_rate`` samples/s:
  ``max(0, 1 - loader_rate / step_rate)``: per batch the loop waits for what the loader
  needs beyond the step's own time.

The recommendation is the setting within C cores that reaches the step rate with the fewest
cores (without a step rate, or when none reaches it: the highest rate, then the fewest
cores; then the most workers), with the requests in flight per worker at which the
measured ingest curve gives the rate it needs (x 2, at least 4), and the cache budget
whose share of the dataset lifts the ingest to that need when the storage alone cannot (0:
no cache needed; the rate predicted is with that cache).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "Recommendation",
    "Setting",
    "StageRates",
    "cache_share_needed",
    "interpolate",
    "recommend",
    "stall_share",
]

#: Requests in flight per worker never recommended below this (the self-tuned floor).
MIN_INFLIGHT = 4
#: Headroom on the requests in flight that a rate needs (latency is not constant).
INFLIGHT_HEADROOM = 2.0


def interpolate(points: Mapping[int, float], x: float) -> float:
    """``points`` (x -> y) linearly interpolated at ``x``, from 0 at 0, flat past the last."""
    xs = sorted(points)
    if not xs:
        raise ValueError("no points to interpolate")
    before_x, before_y = 0.0, 0.0
    for at in xs:
        if x <= at:
            share = (x - before_x) / (at - before_x)
            return before_y + share * (points[at] - before_y)
        before_x, before_y = float(at), points[at]
    return points[xs[-1]]


def stall_share(loader_rate: float, step_rate: float) -> float:
    """The share of step time a loop consuming ``step_rate`` samples/s waits for a loader
    giving ``loader_rate``."""
    if step_rate <= 0:
        raise ValueError(f"the step rate must be > 0, got {step_rate}")
    return max(0.0, 1.0 - loader_rate / step_rate)


def cache_share_needed(ingest: float, target: float, cache_rate: float | None) -> float:
    """The share of the dataset a cache must hold for the ingest to reach ``target`` (0 when
    the storage alone does; ``inf`` when even a full cache cannot)."""
    if ingest >= target:
        return 0.0
    hit_cost = 0.0 if cache_rate is None else 1.0 / cache_rate
    saved_per_hit = 1.0 / ingest - hit_cost
    if saved_per_hit <= 0:
        return math.inf
    return (1.0 / ingest - 1.0 / target) / saved_per_hit


@dataclass(frozen=True)
class Setting:
    """How the loader runs: ``workers`` processes (``num_workers``), ``decode_threads`` each,
    ``inflight`` requests in flight per worker (``FetchConfig.max_inflight_requests``)."""

    workers: int
    decode_threads: int
    inflight: int

    @property
    def cores(self) -> int:
        return max(self.workers, 1) * self.decode_threads

    def __str__(self) -> str:
        return (
            f"{self.workers} workers x {self.decode_threads} decode threads, "
            f"{self.inflight} requests in flight per worker"
        )


@dataclass(frozen=True)
class StageRates:
    """What was measured: ``ingest`` (requests in flight in one process -> samples/s, fetch
    only), ``decode`` (threads in one process -> samples/s, bytes in memory), on ``cpus``
    cores; ``efficiency`` ((workers, threads) -> the fitted share, see the module
    docstring; empty: 1); ``cache_rate`` (fetch-only rate of cache hits, None if not measured);
    ``sample_bytes`` (mean object size)."""

    ingest: Mapping[int, float]
    decode: Mapping[int, float]
    cpus: int
    sample_bytes: float
    efficiency: Mapping[tuple[int, int], float] = field(default_factory=dict)
    cache_rate: float | None = None

    def __post_init__(self) -> None:
        for name, points in (("ingest", self.ingest), ("decode", self.decode)):
            if (
                not points
                or min(points) < 1
                or not all(math.isfinite(v) and v > 0 for v in points.values())
            ):
                raise ValueError(f"{name} rates must be > 0 at settings >= 1, got {points}")
        if self.cpus < 1:
            raise ValueError(f"cpus must be >= 1, got {self.cpus}")
        if not all(0 < share <= 1 for share in self.efficiency.values()):
            raise ValueError(f"efficiencies must be in (0, 1], got {self.efficiency}")

    def efficiency_at(self, setting: Setting) -> float:
        """The share fitted at ``setting``, or the nearest measured worker count's median."""
        if not self.efficiency:
            return 1.0
        key = (max(setting.workers, 1), setting.decode_threads)
        if key in self.efficiency:
            return self.efficiency[key]
        counts = {w for w, _ in self.efficiency}
        near = min(counts, key=lambda w: (abs(w - key[0]), -w))
        return statistics.median(v for (w, _), v in self.efficiency.items() if w == near)

    @property
    def latency_s(self) -> float:
        """Seconds per GET at the fewest requests in flight measured (Little's law)."""
        fewest = min(self.ingest)
        return fewest / self.ingest[fewest]

    @property
    def ingest_ceiling(self) -> float:
        return max(self.ingest.values())

    def ingest_at(self, setting: Setting, cache_share: float = 0.0) -> float:
        rate = interpolate(self.ingest, max(setting.workers, 1) * setting.inflight)
        share = min(max(cache_share, 0.0), 1.0)
        if share == 0.0:
            return rate
        hit_cost = 0.0 if self.cache_rate is None else share / self.cache_rate
        return 1.0 / ((1.0 - share) / rate + hit_cost) if share < 1 or hit_cost else math.inf

    def decode_at(self, setting: Setting) -> float:
        return interpolate(self.decode, setting.cores)

    def stages_at(self, setting: Setting, cache_share: float = 0.0) -> float:
        """``min(ingest, decode)``: the rate before ``efficiency``."""
        return min(self.ingest_at(setting, cache_share), self.decode_at(setting))

    def loader_rate(self, setting: Setting, cache_share: float = 0.0) -> float:
        return self.efficiency_at(setting) * self.stages_at(setting, cache_share)

    def bottleneck(self, setting: Setting, cache_share: float = 0.0) -> str:
        ingest = self.ingest_at(setting, cache_share)
        return "storage" if ingest < self.decode_at(setting) else "decode"

    def inflight_for(self, rate: float, workers: int) -> int:
        """Requests in flight per worker for an ingest of ``rate`` (at most the ceiling) over
        ``workers``: where the measured curve reaches it, with headroom."""
        target = min(rate, self.ingest_ceiling)
        needed, before_x, before_y = 0.0, 0.0, 0.0
        for at in sorted(self.ingest):
            y = self.ingest[at]
            if y >= target and y > before_y:
                needed = before_x + (target - before_y) / (y - before_y) * (at - before_x)
                break
            before_x, before_y = float(at), max(before_y, y)
        return max(MIN_INFLIGHT, math.ceil(INFLIGHT_HEADROOM * needed / max(workers, 1)))

    def with_efficiency(self, measured: Iterable[tuple[Setting, float]]) -> StageRates:
        """These rates with ``efficiency`` fitted to end-to-end rates measured at settings."""
        ratios: dict[tuple[int, int], list[float]] = {}
        for s, rate in measured:
            stages = self.stages_at(s)
            if stages > 0:
                ratios.setdefault((max(s.workers, 1), s.decode_threads), []).append(rate / stages)
        fitted = {key: min(1.0, max(statistics.median(r), 1e-6)) for key, r in ratios.items()}
        return replace(self, efficiency=fitted) if fitted else self


@dataclass(frozen=True)
class Recommendation:
    setting: Setting
    rate: float  # samples/s predicted at ``setting`` (with the cache budget, if any)
    bottleneck: str  # "storage" or "decode"
    stall: float | None  # share of step time waited, None without a step rate
    cache_budget_bytes: int  # 0: no cache needed
    cache_share: float  # of the dataset, the budget's share (0..1)


def _candidates(rates: StageRates) -> list[tuple[int, int]]:
    threads = sorted({1, *(t for t in rates.decode if t <= rates.cpus)})
    return [
        (workers, t)
        for workers in range(1, rates.cpus + 1)
        for t in threads
        if workers * t <= rates.cpus
    ]


def recommend(
    rates: StageRates,
    *,
    step_rate: float | None = None,
    dataset_bytes: int,
    remote: bool = True,
) -> Recommendation:
    """The settings to use (see the module docstring); ``remote`` False (a local directory):
    requests in flight do not apply and no cache is recommended."""
    options = []
    for workers, threads in _candidates(rates):
        decode = rates.decode_at(Setting(workers, threads, 1))
        efficiency = rates.efficiency_at(Setting(workers, threads, 1))
        need = decode if step_rate is None else min(decode, step_rate / efficiency)
        inflight = rates.inflight_for(need, workers) if remote else max(MIN_INFLIGHT, 64)
        setting = Setting(workers, threads, inflight)
        options.append((setting, rates.loader_rate(setting)))
    best = max(rate for _, rate in options)
    if step_rate is not None and best >= step_rate:
        enough = [(s, r) for s, r in options if r >= step_rate]
    else:
        enough = [(s, r) for s, r in options if r >= 0.98 * best]
    # fewest cores; then more processes (the work outside the decoders holds the GIL)
    setting, rate = min(enough, key=lambda o: (o[0].cores, -o[0].workers, -o[1]))
    share = 0.0
    if remote and rates.bottleneck(setting) == "storage":
        target = rates.decode_at(setting)
        if step_rate is not None:
            target = min(target, step_rate / rates.efficiency_at(setting))
        share = min(1.0, cache_share_needed(rates.ingest_at(setting), target, rates.cache_rate))
        rate = rates.loader_rate(setting, share)
    return Recommendation(
        setting=setting,
        rate=rate,
        bottleneck=rates.bottleneck(setting, share),
        stall=None if step_rate is None else stall_share(rate, step_rate),
        cache_budget_bytes=math.ceil(share * dataset_bytes),
        cache_share=share,
    )
