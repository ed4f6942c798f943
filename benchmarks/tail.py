"""The tail benchmark: epochs through the fault proxy, with and without faults, a SlowDown
storm, local disk for reference, and the in-flight sweep of the self-tuned limit.

``python -m benchmarks.tail`` starts a local S3 server, uploads ``--objects`` objects of 2-60
KB (random bytes, seeded), and reads them with ``--workers`` loader workers through a
:class:`~concurrent_loader.testing.ProxyProcess`. Sections (``--sections``, all by default):

- ``matrix``: one shuffled epoch per run, under the S3-like latency (``--preset``: a first
  byte after 30 ms at the median, 200 ms at p99, 0.5 % of GETs 2 s late): ``clean``
  (latency only); ``faults`` (the fault matrix on top: 10 % 503 SlowDown, 5 % resets before
  and during the body, 2 % truncated bodies, 1 % stalls after the headers for
  ``--stall-seconds``); ``faults, not hedged`` (the same with ``FetchConfig.hedge`` off);
  and ``local disk`` (the same loader and order over the objects in a local directory);
- ``storm``: ``--storm-passes`` passes over the objects (one sampler) under the S3-like
  latency, with every GET answered 503 SlowDown from ``--storm-start`` s after the first
  GET for ``--storm-seconds`` s; reports samples per second in ``--bin`` s bins, the
  pre-storm rate, and how long after the storm's end a bin first reached 90 % of it;
- ``sweep``: one epoch per ``max_inflight_requests`` in ``--inflight`` and the self-tuned
  default, at each fixed first-byte latency in ``--latencies`` (ms), in ``--sweep-repeats``
  interleaved rounds; reports the median samples/s of each and the self-tuned median over
  the best fixed one.

Every run checks that each sample arrived once, byte-identical, in the sampler's order (the
benchmark fails otherwise) and reports the hedges sent against the budget (hedges over
first GETs must stay within ``HedgeConfig.budget`` + 1 %). Fetch settings are the
library's defaults unless said otherwise.

``--smoke`` runs a tiny version of every section (40 objects, stalls of 1 s and a 1 s read
timeout, a 0.5 s storm, one sweep latency) for tests: it proves the harness works and its
figures are finite, nothing about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BUCKET = "tail"
PREFIX = "objects/"
BATCH_SIZE = 32
MIN_BYTES = 2 * 1024
MAX_BYTES = 60 * 1024
SECTIONS = ("matrix", "storm", "sweep")
#: the sweep's label for the self-tuned default (``max_inflight_requests=None``)
AUTO = "auto"
#: ...and for its second epoch of one loader (new workers, starting where the first tuned)
WARM = "auto, warm"


def _digest(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def make_objects(count: int, seed: int) -> dict[str, bytes]:
    """``count`` objects of 2-60 KB random bytes, keyed ``00000.bin`` ..."""
    rng = random.Random(seed)
    return {f"{i:05d}.bin": rng.randbytes(rng.randint(MIN_BYTES, MAX_BYTES)) for i in range(count)}


def fault_matrix(seed: int, stall_seconds: float) -> Any:
    from concurrent_loader.testing import FaultPlan

    return FaultPlan(
        seed=seed,
        slowdown_503=0.10,
        reset_before=0.025,
        reset_mid_body=0.025,
        truncate=0.02,
        stall=0.01,
        stall_seconds=stall_seconds,
    )


@dataclasses.dataclass
class Bench:
    """What every run shares: the server, the objects and their digests."""

    server: Any
    root: Path
    keys: list[str]
    digests: dict[str, str]
    workers: int
    seed: int

    def epoch(
        self,
        fetch_config: Any,
        *,
        proxy: Any = None,
        passes: int = 1,
        step_s: float = 0.0,
        epochs: int = 1,
    ) -> dict[str, Any]:
        """``passes`` shuffled passes as one sampler, over ``proxy`` (or the local
        directory when None), with a simulated training step of ``step_s`` per batch;
        checks every sample and returns the run's figures (of the last of ``epochs`` epochs
        of one loader: new worker processes each, starting where the last epoch's tuned)."""
        import torch

        from concurrent_loader import ConcurrentDataLoader, ObjectDataset
        from concurrent_loader.stores import S3Config

        if proxy is None:
            ds = ObjectDataset(str(self.root), self.keys, decode=_digest)
        else:
            ds = ObjectDataset(
                S3Config.from_url(
                    f"s3://{BUCKET}/{PREFIX}",
                    endpoint_url=proxy.endpoint_url,
                    region=self.server.region,
                    aws_access_key_id=self.server.access_key,
                    aws_secret_access_key=self.server.secret_key,
                ),
                self.keys,
                decode=_digest,
                fetch_config=fetch_config,
            )
        generator = torch.Generator().manual_seed(self.seed)
        order = [
            i
            for _ in range(passes)
            for i in torch.randperm(len(self.keys), generator=generator).tolist()
        ]
        loader = ConcurrentDataLoader(
            ds, batch_size=BATCH_SIZE, sampler=order, num_workers=self.workers
        )
        want = [
            [self.digests[self.keys[i]] for i in order[start : start + BATCH_SIZE]]
            for start in range(0, len(order), BATCH_SIZE)
        ]
        for _ in range(epochs):
            arrivals: list[float] = []
            batches: list[list[str]] = []
            started = time.perf_counter()
            for batch in loader:
                arrivals.append(time.perf_counter() - started)
                batches.append(list(batch))
                if step_s:
                    time.sleep(step_s)  # the model's step: the loader works on meanwhile
            seconds = time.perf_counter() - started
            if batches != want:
                wrong = next(
                    (i for i, (a, b) in enumerate(zip(batches, want, strict=False)) if a != b),
                    min(len(batches), len(want)),
                )
                raise AssertionError(f"batch {wrong} is not the sampler's batch, byte for byte")
        stats = loader.stats()
        figures: dict[str, Any] = {
            "epoch_s": seconds,
            "samples": len(order),
            "samples_per_s": len(order) / seconds,
            # After the first batch (worker start-up and the first round trips excluded),
            # as benchmarks.run measures after its warm-up batches.
            "steady_samples_per_s": (len(order) - BATCH_SIZE)
            / max(1e-9, arrivals[-1] - arrivals[0]),
            "wait_p50_ms": (stats["wait_s_per_batch"]["p50"] or 0.0) * 1000,
            "wait_p99_ms": (stats["wait_s_per_batch"]["p99"] or 0.0) * 1000,
            # The training loop's time per batch (wait + step), after the first batch.
            "iter_p50_ms": _percentile(arrivals, 50) * 1000,
            "iter_p99_ms": _percentile(arrivals, 99) * 1000,
            **{name: stats[name] for name in ("retries", "throttles", "hedges", "hedges_won")},
            "arrivals": arrivals,
        }
        if proxy is not None:
            proxy_stats = proxy.stats()
            gets = proxy_stats["requests_by_method"].get("GET", 0)
            figures["gets_sent"] = gets
            figures["faults"] = sum(proxy_stats["faults"].values())
            figures["stragglers"] = proxy_stats["stragglers"]
            # Hedges over the GETs that were not hedges: the budget's own measure.
            figures["hedge_share"] = stats["hedges"] / max(1, gets - stats["hedges"])
            figures["storm_clock_s"] = proxy_stats.get("storm_clock_s")
            figures["read_at_s"] = time.perf_counter() - started
        return figures


def _percentile(arrivals: list[float], q: float) -> float:
    """The ``q``-th percentile of the times between consecutive batches (nearest rank)."""
    gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))
    if not gaps:
        return 0.0
    return gaps[min(len(gaps) - 1, max(0, round(q / 100 * len(gaps)) - 1))]


def _matrix(
    bench: Bench, config: Any, preset: str, stall_seconds: float, step_s: float
) -> dict[str, Any]:
    from concurrent_loader import HedgeConfig
    from concurrent_loader.testing import ProxyProcess

    runs = {
        "clean": (None, config),
        "faults": (fault_matrix(bench.seed, stall_seconds), config),
        "faults, not hedged": (
            fault_matrix(bench.seed, stall_seconds),
            dataclasses.replace(config, hedge=HedgeConfig(enabled=False)),
        ),
    }
    results: dict[str, Any] = {}
    for name, (faults, fetch_config) in runs.items():
        with ProxyProcess(bench.server.endpoint_url, preset=preset, faults=faults) as proxy:
            results[name] = bench.epoch(fetch_config, proxy=proxy)
    results["local disk"] = bench.epoch(config)
    if step_s:
        with ProxyProcess(bench.server.endpoint_url, preset=preset) as proxy:
            results["clean, step"] = bench.epoch(config, proxy=proxy, step_s=step_s)
        results["local disk, step"] = bench.epoch(config, step_s=step_s)
    return results


def _storm(
    bench: Bench, config: Any, preset: str, start: float, seconds: float, passes: int, bin_s: float
) -> dict[str, Any]:
    from concurrent_loader.testing import FaultPlan, ProxyProcess

    plan = FaultPlan(seed=bench.seed, storm_start_s=start, storm_seconds=seconds)
    with ProxyProcess(bench.server.endpoint_url, preset=preset, faults=plan) as proxy:
        run = bench.epoch(config, proxy=proxy, passes=passes)
    # The storm's clock started at the proxy's first object GET: on ours, at
    # read_at_s - storm_clock_s (both read at the end of the run).
    first_get = run["read_at_s"] - run["storm_clock_s"]
    storm_start, storm_end = first_get + start, first_get + start + seconds
    arrivals = run["arrivals"]
    bins = [0] * (int(run["epoch_s"] / bin_s) + 1)
    for at in arrivals:
        bins[int(at / bin_s)] += BATCH_SIZE
    rates = [count / bin_s for count in bins]
    # Pre-storm rate: whole bins from the first batch to the storm's start.
    first_bin, pre_end = int(arrivals[0] / bin_s) + 1, int(storm_start / bin_s)
    pre = rates[first_bin:pre_end]
    pre_rate = sum(pre) / len(pre) if pre else float("nan")
    back_after = None
    # The first bin after the storm that reaches 90 % of the pre-storm rate (the last
    # bin is partial: the epoch ends in it).
    for i in range(int(storm_end / bin_s) + 1, len(rates) - 1):
        if rates[i] >= 0.9 * pre_rate:
            back_after = (i + 1) * bin_s - storm_end  # by the end of that bin
            break
    return {
        **{k: v for k, v in run.items() if k != "arrivals"},
        "storm_start_s": storm_start,
        "storm_end_s": storm_end,
        "bin_s": bin_s,
        "rates": rates,
        "pre_storm_rate": pre_rate,
        "back_to_90pct_after_s": back_after,
    }


def _sweep(
    bench: Bench,
    config: Any,
    latencies: Sequence[float],
    inflight: Sequence[int],
    repeats: int,
) -> dict[str, Any]:
    from concurrent_loader.testing import ProxyProcess

    table: dict[str, Any] = {}
    for latency in latencies:
        rates: dict[str, list[float]] = {}
        with ProxyProcess(bench.server.endpoint_url, latency_ms=latency) as proxy:
            for _ in range(repeats):  # rounds, so a busy spell slows every setting alike
                for n in [*inflight, None, WARM]:
                    fixed = n if isinstance(n, int) else None
                    fetch_config = dataclasses.replace(config, max_inflight_requests=fixed)
                    run = bench.epoch(fetch_config, proxy=proxy, epochs=2 if n == WARM else 1)
                    name = str(n) if fixed is not None else (n or AUTO)
                    rates.setdefault(name, []).append(run["samples_per_s"])
                    proxy.reset_stats()
        row: dict[str, Any] = {name: statistics.median(v) for name, v in rates.items()}
        row["rounds"] = rates
        best = max(v for k, v in row.items() if k not in (AUTO, WARM, "rounds"))
        row["auto / best fixed"] = row[AUTO] / best
        row["auto, warm / best fixed"] = row[WARM] / best
        table[f"{latency:g}"] = row
    return table


def run(
    *,
    objects: int = 800,
    workers: int = 2,
    seed: int = 0,
    preset: str = "s3-like",
    stall_seconds: float = 6.0,
    read_timeout: float | None = None,
    sections: Sequence[str] = SECTIONS,
    storm_start: float = 3.0,
    storm_seconds: float = 30.0,
    storm_passes: int = 12,
    bin_s: float = 0.5,
    latencies: Sequence[float] = (0, 20, 50, 100, 200),
    inflight: Sequence[int] = (4, 16, 32, 64),
    sweep_repeats: int = 1,
    step_ms: float = 50.0,
    smoke: bool = False,
) -> dict[str, Any]:
    """Every section's figures (see the module docstring)."""
    from concurrent_loader import FetchConfig, Timeouts
    from concurrent_loader.testing import LocalS3Server

    if smoke:
        objects, stall_seconds, read_timeout = min(objects, 40), 1.0, 1.0
        storm_start, storm_seconds, storm_passes, bin_s = 0.02, 0.5, 3, 0.25
        latencies, inflight = (0,), (4,)
    config = FetchConfig()
    if read_timeout is not None:
        config = dataclasses.replace(config, timeouts=Timeouts(read=read_timeout))
    bodies = make_objects(objects, seed)
    keys = sorted(bodies)
    digests = {key: _digest(body) for key, body in bodies.items()}
    report: dict[str, Any] = {
        "objects": objects,
        "workers": workers,
        "preset": preset,
        "stall_seconds": stall_seconds,
        "read_timeout_s": config.timeouts.read,
        "hedge_budget": config.hedge.budget,
        "step_ms": step_ms,
    }
    with tempfile.TemporaryDirectory(prefix="tail-bench-") as tmp, LocalS3Server() as server:
        root = Path(tmp) / "objects"
        root.mkdir()
        for key, body in bodies.items():
            (root / key).write_bytes(body)
        server.create_bucket(BUCKET)
        server.upload_dir(root, BUCKET, prefix=PREFIX)
        bench = Bench(server, root, keys, digests, workers, seed)
        if "matrix" in sections:
            runs = _matrix(bench, config, preset, stall_seconds, step_ms / 1000)
            for figures in runs.values():
                figures.pop("arrivals")
            clean = runs["clean"]
            report["runs"] = runs
            report["ratios"] = {
                f"{name} / clean": r["epoch_s"] / clean["epoch_s"]
                for name, r in runs.items()
                if name != "clean"
            }
            report["s3 / local disk throughput"] = (
                clean["samples_per_s"] / runs["local disk"]["samples_per_s"]
            )
            report["clean wait p99 / p50"] = clean["wait_p99_ms"] / max(clean["wait_p50_ms"], 1e-9)
            if "clean, step" in runs:
                stepped = runs["clean, step"]
                local = runs["local disk, step"]
                report["s3 / local disk throughput, step"] = (
                    stepped["samples_per_s"] / local["samples_per_s"]
                )
                report["s3 / local disk steady throughput, step"] = (
                    stepped["steady_samples_per_s"] / local["steady_samples_per_s"]
                )
                report["step iteration p99 / p50"] = stepped["iter_p99_ms"] / max(
                    stepped["iter_p50_ms"], 1e-9
                )
        if "storm" in sections:
            report["storm"] = _storm(
                bench, config, preset, storm_start, storm_seconds, storm_passes, bin_s
            )
        if "sweep" in sections:
            report["sweep"] = _sweep(bench, config, latencies, inflight, sweep_repeats)
    budget = config.hedge.budget + 0.01
    shares = [r["hedge_share"] for r in report.get("runs", {}).values() if "hedge_share" in r]
    if "storm" in report:
        shares.append(report["storm"]["hedge_share"])
    report["hedges within budget + 1 %"] = all(share <= budget for share in shares)
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{report['objects']} objects of 2-60 KB, {report['workers']} workers, "
        f"latency {report['preset']}, stalls {report['stall_seconds']:g} s, "
        f"read timeout {report['read_timeout_s']:g} s"
    ]
    columns = (
        "epoch_s",
        "wait_p50_ms",
        "wait_p99_ms",
        "iter_p50_ms",
        "iter_p99_ms",
        "gets_sent",
        "faults",
        "stragglers",
        "retries",
        "throttles",
        "hedges",
        "hedges_won",
        "hedge_share",
    )

    def cells(figures: dict[str, Any]) -> str:
        out = ""
        for c in columns:
            value = figures.get(c, "-")
            out += f"{value:>12.3f}" if isinstance(value, float) else f"{value:>12}"
        return out

    if "runs" in report:
        lines.append(f"{'run':<20}" + "".join(f"{c:>12}" for c in columns))
        for name, figures in report["runs"].items():
            lines.append(f"{name:<20}{cells(figures)}")
        for name, ratio in report["ratios"].items():
            lines.append(f"epoch time, {name}: {ratio:.2f}x")
        lines.append(
            f"throughput, ours over S3 (s3-like, clean) / ours on local disk: "
            f"{report['s3 / local disk throughput']:.2f}x"
        )
        lines.append(f"clean run, wait per batch p99 / p50: {report['clean wait p99 / p50']:.2f}x")
        if "s3 / local disk throughput, step" in report:
            lines.append(
                f"with a {report['step_ms']:g} ms training step per batch: ours over S3 / "
                f"ours on local disk {report['s3 / local disk throughput, step']:.3f}x "
                f"(after the first batch: "
                f"{report['s3 / local disk steady throughput, step']:.3f}x); "
                f"time per batch p99 / p50 {report['step iteration p99 / p50']:.2f}x"
            )
    if "storm" in report:
        s = report["storm"]
        lines.append(
            f"storm: 503 SlowDown from {s['storm_start_s']:.1f} s to {s['storm_end_s']:.1f} s "
            f"of a {s['epoch_s']:.1f} s run of {s['samples']} samples"
        )
        lines.append(f"{'storm run':<20}{cells(s)}")
        series = " ".join(f"{rate:.0f}" for rate in s["rates"])
        lines.append(f"samples/s per {s['bin_s']:g} s bin: {series}")
        back = s["back_to_90pct_after_s"]
        lines.append(
            f"pre-storm {s['pre_storm_rate']:.0f} samples/s; back to >= 90 % of it "
            + (f"{back:.2f} s after the storm's end" if back is not None else "never")
        )
    if "sweep" in report:
        table = report["sweep"]
        ratios = ("auto / best fixed", "auto, warm / best fixed")
        names = [k for k in next(iter(table.values())) if k not in (*ratios, "rounds")]
        lines.append(
            "samples/s by max_inflight_requests (auto: self-tuned; warm: a loader's second"
            " epoch) and first-byte latency (median of each setting's rounds)"
        )
        lines.append(
            f"{'latency ms':<12}"
            + "".join(f"{n:>12}" for n in names)
            + f"{'auto/best':>12}{'warm/best':>12}"
        )
        for latency, row in table.items():
            lines.append(
                f"{latency:<12}"
                + "".join(f"{row[n]:>12.1f}" for n in names)
                + "".join(f"{row[r]:>12.3f}" for r in ratios)
            )
    lines.append(
        f"hedges within budget ({report['hedge_budget']:.0%} + 1 %) in every run: "
        f"{report['hedges within budget + 1 %']}"
    )
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tail",
        description="Epochs through the fault proxy: faults, a storm, the in-flight sweep.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--objects", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="s3-like", help="the proxy's latency preset")
    parser.add_argument("--stall-seconds", type=float, default=6.0)
    parser.add_argument(
        "--read-timeout", type=float, default=None, help="Timeouts.read (default: the library's)"
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="any of " + ", ".join(SECTIONS)
    )
    parser.add_argument("--storm-start", type=float, default=3.0)
    parser.add_argument("--storm-seconds", type=float, default=30.0)
    parser.add_argument("--storm-passes", type=int, default=12, help="passes over the objects")
    parser.add_argument("--bin", type=float, default=0.5, help="seconds per throughput bin")
    parser.add_argument("--latencies", default="0,20,50,100,200", help="sweep latencies, ms")
    parser.add_argument("--inflight", default="4,16,32,64", help="sweep's fixed values")
    parser.add_argument("--sweep-repeats", type=int, default=1, help="sweep rounds")
    parser.add_argument(
        "--step-ms", type=float, default=50.0, help="simulated training step per batch (0: none)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for tests")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    report = run(
        objects=args.objects,
        workers=args.workers,
        seed=args.seed,
        preset=args.preset,
        stall_seconds=args.stall_seconds,
        read_timeout=args.read_timeout,
        sections=sections,
        storm_start=args.storm_start,
        storm_seconds=args.storm_seconds,
        storm_passes=args.storm_passes,
        bin_s=args.bin,
        latencies=_floats(args.latencies),
        inflight=[int(x) for x in _floats(args.inflight)],
        sweep_repeats=args.sweep_repeats,
        step_ms=args.step_ms,
        smoke=args.smoke,
    )
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
