"""``concurrent-loader analyze ROOT``: measure the loader's stages apart, predict the stall.

As the data-stalls study's DS-Analyzer does, on this loader, within ``seconds`` (split
across the measurements, after listing ROOT):

1. ingest: the loader fetching only (each object's bytes, no decode) in one process at a
   few requests in flight (for a local directory: reading on every core);
2. decode: bytes already in memory -> samples, on 1 thread, then 2, 4, ... up to ``cpus``;
3. end to end: the loader at several worker x decode-thread settings within ``cpus`` cores;
4. with ``cache_budget``: a first pass through a temporary node cache, then the fetch-only
   rate of its hits;
5. the model of :mod:`concurrent_loader.metrics.predict` (stated there) fitted to those, the
   stall share for a given step rate, and the settings and cache budget it recommends.

ROOT holding images in class folders is read as an ``ImageFolder`` (``image_size``), any
other root as objects (raw bytes). Errors name the root: a root that cannot be listed or
holds nothing fails at the listing, before any measurement.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ..cache import CacheConfig
from ..config import FetchConfig
from ..dataset import IMG_EXTENSIONS, ImageFolder, ObjectDataset
from ..decode import image_decoder
from ..listing import empty_root, list_store
from ..listing import progress as listing_progress
from ..metrics.predict import Recommendation, Setting, StageRates, recommend
from ..pipeline.options import available_cpus
from ..stores import StoreConfig
from .measure import Run, decode_rate, object_size, run_loader

__all__ = ["Analysis", "analyze", "settings_within"]

#: Requests in flight per process at which ingest is measured (remote stores).
INGEST_INFLIGHT = (8, 64, 256)
#: Bodies held in memory for the decode measurement.
DECODE_SAMPLES = 32
#: Shares of ``seconds``: ingest, decode, end to end, cache (given to end to end without it).
SHARES = {"ingest": 0.25, "decode": 0.15, "end_to_end": 0.45, "cache": 0.15}


def _doubling(up_to: int) -> list[int]:
    values, n = [], 1
    while n < up_to:
        values.append(n)
        n *= 2
    return [*values, up_to]


def settings_within(cpus: int) -> list[tuple[int, int]]:
    """(workers, decode threads) measured end to end: 1, 2, 4, ... ``cpus`` workers of one
    thread, and one worker of ``cpus`` threads."""
    pairs = [(workers, 1) for workers in _doubling(cpus)]
    return pairs + ([(1, cpus)] if cpus > 1 else [])


@dataclass
class Analysis:
    """Everything ``analyze`` measured and predicted (rates in samples/s)."""

    root: str
    kind: str  # "images" or "objects"
    objects: int
    dataset_bytes: int
    cpus: int
    batch_size: int
    ingest: dict[int, Run] = field(default_factory=dict)  # requests in flight -> fetch only
    decode: dict[int, float] = field(default_factory=dict)  # threads -> rate
    end_to_end: list[tuple[Setting, Run]] = field(default_factory=list)
    cache: dict[str, Any] | None = None
    step_rate: float | None = None
    remote: bool = True
    seconds: float = 0.0
    rates: StageRates | None = None
    recommendation: Recommendation | None = None

    def summary(self) -> dict[str, Any]:
        """The figures as plain values (JSON)."""
        rates, rec = self.rates, self.recommendation
        out: dict[str, Any] = {
            "root": self.root,
            "kind": self.kind,
            "objects": self.objects,
            "dataset_bytes": self.dataset_bytes,
            "cpus": self.cpus,
            "batch_size": self.batch_size,
            "seconds": self.seconds,
            "ingest": {
                str(n): {"objects_per_s": run.rate, "bytes_per_s": run.bytes_per_s}
                for n, run in self.ingest.items()
            },
            "decode_per_s": {str(t): rate for t, rate in self.decode.items()},
            "end_to_end": [
                {
                    "workers": s.workers,
                    "decode_threads": s.decode_threads,
                    "max_inflight_requests": s.inflight,
                    "measured_per_s": run.rate,
                    "model_per_s": rates.loader_rate(s) if rates else None,
                }
                for s, run in self.end_to_end
            ],
            "cache": self.cache,
            "step_rate": self.step_rate,
        }
        if rates is not None:
            out["efficiency"] = {f"{w}x{t}": share for (w, t), share in rates.efficiency.items()}
            out["get_latency_s"] = rates.latency_s if self.remote else None
        if rec is not None:
            out["recommendation"] = {
                "workers": rec.setting.workers,
                "decode_threads": rec.setting.decode_threads,
                "max_inflight_requests": rec.setting.inflight if self.remote else None,
                "predicted_per_s": rec.rate,
                "bottleneck": rec.bottleneck,
                "stall_share": rec.stall,
                "cache_budget_bytes": rec.cache_budget_bytes,
            }
        return out


class _Bar:
    """One tqdm bar on stderr over the measurements (nothing when disabled or without tqdm)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc="analyze", file=sys.stderr, leave=False)

    def step(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_description(f"analyze: {what}")

    def done(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def analyze(
    store: StoreConfig,
    *,
    cpus: int | None = None,
    seconds: float = 60.0,
    batch_size: int = 64,
    image_size: int = 224,
    objects: bool = False,
    step_rate: float | None = None,
    cache_budget: int | None = None,
    progress: bool = True,
    seed: int = 0,
) -> Analysis:
    """Measure ``store``'s dataset and predict (see the module docstring)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    cpus = cpus or available_cpus()
    if cpus < 1 or batch_size < 1:
        raise ValueError(f"cpus and batch size must be >= 1, got {cpus} and {batch_size}")
    fetch = FetchConfig()
    with listing_progress(progress, f"listing {store}") as tick:
        found = list_store(store, fetch, on_object=tick)
    if not found:
        raise empty_root(store, f"no objects under {store}")
    keys = [info.key for info in found]
    sizes = {info.key: info.size for info in found}
    images = not objects and any("/" in k and k.lower().endswith(IMG_EXTENSIONS) for k in keys)
    if images:
        folder = ImageFolder(store, keys=keys, image_size=image_size)
        keys = list(folder.keys)
    remote = store.capabilities.remote
    result = Analysis(
        root=str(store),
        kind="images" if images else "objects",
        objects=len(keys),
        dataset_bytes=sum(sizes[k] for k in keys),
        cpus=cpus,
        batch_size=min(batch_size, len(keys)),
        step_rate=step_rate,
        remote=remote,
    )
    batch_size = result.batch_size
    shares = dict(SHARES)
    if not (cache_budget and remote):
        shares["end_to_end"] += shares.pop("cache")
    inflights = INGEST_INFLIGHT if remote else (cpus,)
    threads = _doubling(cpus)
    pairs = settings_within(cpus)
    bar = _Bar(progress, len(inflights) + len(threads) + len(pairs) + ("cache" in shares))
    stall_timeout_s = max(30.0, 2 * seconds)
    started = time.perf_counter()
    try:
        for n in inflights:
            bar.step(f"ingest, {n} in flight" if remote else f"reading on {n} threads")
            dataset = ObjectDataset(
                store, keys, decode=object_size, fetch_config=FetchConfig(max_inflight_requests=n)
            )
            result.ingest[n] = run_loader(
                dataset,
                seconds=shares["ingest"] * seconds / len(inflights),
                batch_size=batch_size,
                workers=0,
                decode_threads=cpus,
                stall_timeout_s=stall_timeout_s,
                seed=seed,
            )
            bar.done()
        bodies = _bodies(store, keys, seed)
        decode = image_decoder(image_size) if images else _copy
        for t in threads:
            bar.step(f"decode, {t} threads")
            result.decode[t] = decode_rate(
                decode, bodies, t, shares["decode"] * seconds / len(threads)
            )
            bar.done()
        full: Any = folder if images else ObjectDataset(store, keys)
        inflight = fetch.inflight_start
        for workers, t in pairs:
            bar.step(f"end to end, {workers} workers x {t} threads")
            run = run_loader(
                full,
                seconds=shares["end_to_end"] * seconds / len(pairs),
                batch_size=batch_size,
                workers=workers,
                decode_threads=t,
                stall_timeout_s=stall_timeout_s,
                seed=seed,
            )
            # at the requests in flight the run tuned itself to, not those it started at
            result.end_to_end.append((Setting(workers, t, run.inflight or inflight), run))
            bar.done()
        if "cache" in shares and cache_budget:
            bar.step("cache")
            result.cache = _measure_cache(
                store,
                keys,
                sizes,
                cache_budget,
                shares["cache"] * seconds,
                batch_size=batch_size,
                cpus=cpus,
                stall_timeout_s=stall_timeout_s,
                seed=seed,
                ingest_rate=max(run.rate for run in result.ingest.values()),
            )
            bar.done()
    finally:
        bar.close()
    result.seconds = time.perf_counter() - started
    _predict(result, cache_budget)
    return result


def _predict(result: Analysis, cache_budget: int | None) -> None:
    stages = StageRates(
        ingest={n: max(run.rate, 1e-9) for n, run in result.ingest.items()},
        decode={t: max(rate, 1e-9) for t, rate in result.decode.items()},
        cpus=result.cpus,
        sample_bytes=result.dataset_bytes / result.objects,
        cache_rate=result.cache["hit_rate_per_s"] if result.cache else None,
    )
    result.rates = stages.with_efficiency((s, run.rate) for s, run in result.end_to_end)
    result.recommendation = recommend(
        result.rates,
        step_rate=result.step_rate,
        dataset_bytes=result.dataset_bytes,
        remote=result.remote,
    )
    if result.cache is not None and cache_budget:
        share = min(1.0, cache_budget / max(result.dataset_bytes, 1))
        setting = result.recommendation.setting
        result.cache["budget_share"] = share
        result.cache["predicted_per_s"] = result.rates.loader_rate(setting, share)


def _copy(data: bytes, url: str) -> bytes:
    """The "decode" of raw objects: the bytes the loader hands over (one copy)."""
    return bytes(data)


def _bodies(store: StoreConfig, keys: list[str], seed: int) -> list[tuple[bytes, str]]:
    """A few objects' bytes, fetched once, with their URLs."""
    chosen = random.Random(seed).sample(keys, min(DECODE_SAMPLES, len(keys)))
    with ObjectDataset(store, chosen) as dataset:
        data = dataset.__getitems__(list(range(len(chosen))))
    return [(bytes(body), store.url_for(key)) for body, key in zip(data, chosen, strict=True)]


def _measure_cache(
    store: StoreConfig,
    keys: list[str],
    sizes: dict[str, int],
    budget: int,
    seconds: float,
    *,
    batch_size: int,
    cpus: int,
    stall_timeout_s: float,
    seed: int,
    ingest_rate: float,
) -> dict[str, Any]:
    """A first pass through a temporary cache of ``budget`` bytes over as many objects as
    it holds and the first half of ``seconds`` can fetch, then the fetch-only rate of its
    hits for the second half."""
    mean = sum(sizes.values()) / len(sizes)
    fits = int(min(budget / mean, ingest_rate * seconds / 2))
    subset = keys[: max(min(len(keys), fits), batch_size)]
    with tempfile.TemporaryDirectory(prefix="concurrent-loader-analyze-") as directory:
        cache = CacheConfig(directory, max_bytes=budget)
        first = ObjectDataset(store, subset, decode=object_size, cache=cache)
        with first:
            first_items = first.__getitems__(list(range(len(subset))))
        run = run_loader(
            ObjectDataset(store, subset, decode=object_size, cache=cache),
            seconds=seconds / 2,
            batch_size=batch_size,
            workers=0,
            decode_threads=cpus,
            stall_timeout_s=stall_timeout_s,
            seed=seed,
        )
    return {
        "budget_bytes": budget,
        "objects_filled": len(first_items),
        "hit_rate_per_s": max(run.rate, 1e-9),
        "hit_share": run.stats.get("cache_hit_rate"),
    }
