"""A check of ``concurrent-loader analyze``'s prediction against the loader itself.

``python -m benchmarks.analyze`` generates the benchmark's ImageNet-like JPEGs (:mod:`.data`),
uploads them to a local S3 server and, for each added latency (``--latency-ms``, through a
:class:`~concurrent_loader.testing.ProxyProcess`):

1. runs ``analyze`` on ``s3://<bucket>/train/`` for ``--analyze-seconds``;
2. runs the loader with the recommended settings (workers, decode threads, requests in
   flight; the cache budget is reported, not used) for ``--seconds``, shuffled, and compares
   its images/s with the rate predicted at that setting without a cache (goal: within 15 %);
3. runs the same loader under a training loop that sleeps ``--step-ms`` per batch (default:
   a step 1.25 x faster than the predicted rate, so that the loader, not the step, sets the
   pace: a predicted stall of 20 %), and compares the share of the loop's time spent waiting
   for batches with the predicted stall (goal: within 10 percentage points).

The first batch of every run (workers and connections starting) is not counted. ``--smoke``
runs a tiny version for tests: it proves the harness works and its figures are finite, nothing
about accuracy.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
IMAGE_SIZE = 224
GOAL_RATE = 0.15
GOAL_STALL = 0.10


def _loader_run(
    dataset: Any, rec: Any, seconds: float, batch_size: int, step_s: float
) -> dict[str, float]:
    """The loader at ``rec``'s setting for ``seconds`` after its first batch, sleeping
    ``step_s`` per batch (0: none): images/s and the share of time waited for batches."""
    import torch

    from concurrent_loader import ConcurrentDataLoader

    loader = ConcurrentDataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=rec.setting.workers,
        decode_threads=rec.setting.decode_threads,
        generator=torch.Generator().manual_seed(1),
    )
    images = 0
    waited = stepped = 0.0
    started: float | None = None
    now = time.perf_counter()
    while started is None or now - started < seconds:
        epoch = iter(loader)
        try:
            asked = time.perf_counter()
            for batch_images, _ in epoch:
                got = time.perf_counter()
                counted = started is not None  # the first batch starts the clock
                if started is None:
                    started = got
                else:
                    images += len(batch_images)
                    waited += got - asked
                if step_s:
                    time.sleep(step_s)
                now = asked = time.perf_counter()
                if counted:
                    stepped += now - got
                if now - started >= seconds and images:
                    break
        finally:
            epoch.close()  # type: ignore[attr-defined]  # an EpochIterator
    elapsed = now - (started or now)
    return {
        "images_per_s": images / elapsed,
        "stall_share": waited / (waited + stepped) if waited + stepped else 0.0,
    }


def run(
    *,
    images: int = 2000,
    latencies_ms: Sequence[float] = (0.0, 50.0, 200.0),
    analyze_seconds: float = 30.0,
    seconds: float = 20.0,
    batch_size: int = 32,
    step_ms: float | None = None,
    data_dir: Path | None = None,
    smoke: bool = False,
) -> dict[str, Any]:
    """Every latency's prediction and measurement (see the module docstring)."""
    from concurrent_loader import ImageFolder
    from concurrent_loader.analyze import analyze
    from concurrent_loader.config import FetchConfig
    from concurrent_loader.metrics.predict import stall_share
    from concurrent_loader.stores import S3Config
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    from .data import DatasetSpec, ensure_local, ensure_uploaded

    if smoke:
        images, analyze_seconds, seconds, batch_size = min(images, 48), 2.0, 1.0, 8
    spec = DatasetSpec(images=images, classes=4 if smoke else 10)
    local, _ = ensure_local(spec, data_dir or REPO_ROOT / ".bench" / "data")
    report: dict[str, Any] = {
        "images": images,
        "dataset_mb": local.total_bytes / 1e6,
        "analyze_seconds": analyze_seconds,
        "seconds": seconds,
        "batch_size": batch_size,
        "latencies": {},
    }
    with LocalS3Server() as server:
        bucket, _ = ensure_uploaded(local, server)
        credentials: dict[str, Any] = {
            "region": server.region,
            "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key,
        }
        for latency in latencies_ms:
            with ProxyProcess(server.endpoint_url, latency_ms=latency) as proxy:
                store = S3Config.from_url(
                    f"s3://{bucket}/train/", endpoint_url=proxy.endpoint_url, **credentials
                )
                result = analyze(
                    store,
                    seconds=analyze_seconds,
                    batch_size=batch_size,
                    image_size=IMAGE_SIZE,
                    progress=False,
                )
                rec = result.recommendation
                if rec is None:
                    raise RuntimeError(f"analyze {store} made no recommendation")
                fetch = FetchConfig(max_inflight_requests=rec.setting.inflight)
                dataset = ImageFolder(store, image_size=IMAGE_SIZE, fetch_config=fetch)
                # without the cache the recommendation may add: the runs below have none
                predicted = result.rates.loader_rate(rec.setting) if result.rates else rec.rate
                measured = _loader_run(dataset, rec, seconds, batch_size, 0.0)
                step_rate = batch_size / (step_ms / 1000) if step_ms else 1.25 * predicted
                stalled = _loader_run(dataset, rec, seconds, batch_size, batch_size / step_rate)
                predicted_stall = stall_share(predicted, step_rate)
                report["latencies"][f"{latency:g}"] = {
                    "analysis": result.summary(),
                    "setting": str(rec.setting),
                    "predicted_img_s": predicted,
                    "measured_img_s": measured["images_per_s"],
                    "rate_error": measured["images_per_s"] / predicted - 1,
                    "cache_budget_recommended_bytes": rec.cache_budget_bytes,
                    "step_img_s": step_rate,
                    "predicted_stall": predicted_stall,
                    "measured_stall": stalled["stall_share"],
                    "stall_error_points": 100 * (stalled["stall_share"] - predicted_stall),
                    "stalled_img_s": stalled["images_per_s"],
                    # the stall model alone: the stall its formula gives for the rate seen
                    "stall_from_measured_rate": stall_share(stalled["images_per_s"], step_rate),
                    # the noise: the same setting's end-to-end rate within the analysis
                    "same_setting_in_analysis_img_s": _same_setting(result, rec.setting),
                }
    return report


def _same_setting(result: Any, setting: Any) -> float | None:
    """The analysis' own end-to-end rate at ``setting``'s workers and threads, if measured."""
    for measured, run in result.end_to_end:
        if (measured.workers, measured.decode_threads) == (setting.workers, setting.decode_threads):
            return float(run.rate)
    return None


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{report['images']} images ({report['dataset_mb']:.0f} MB), batch "
        f"{report['batch_size']}, analyze {report['analyze_seconds']:g} s, runs "
        f"{report['seconds']:g} s"
    ]
    for latency, row in report["latencies"].items():
        rate_ok = abs(row["rate_error"]) <= GOAL_RATE
        stall_ok = abs(row["stall_error_points"]) <= 100 * GOAL_STALL
        lines.append(
            f"+{latency} ms: {row['setting']}: predicted {row['predicted_img_s']:.0f} img/s, "
            f"measured {row['measured_img_s']:.0f} ({row['rate_error']:+.0%}, "
            f"{'within' if rate_ok else 'outside'} 15 %); step {row['step_img_s']:.0f} img/s: "
            f"stall predicted {row['predicted_stall']:.0%}, measured {row['measured_stall']:.0%} "
            f"({row['stall_error_points']:+.0f} points, "
            f"{'within' if stall_ok else 'outside'} 10); the formula on the rate seen "
            f"{row['stall_from_measured_rate']:.0%}"
        )
        same = row["same_setting_in_analysis_img_s"]
        if same is not None:
            lines.append(
                f"    the same setting within the analysis: {same:.0f} img/s "
                f"({row['measured_img_s'] / same - 1:+.0%} run to run)"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.analyze", description=__doc__)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--latency-ms", default="0,50,200", help="comma separated")
    parser.add_argument("--analyze-seconds", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="each loader run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=None)
    parser.add_argument("--data-dir", type=Path, default=None, help="dataset cache")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for tests")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    report = run(
        images=args.images,
        latencies_ms=[float(v) for v in args.latency_ms.split(",")],
        analyze_seconds=args.analyze_seconds,
        seconds=args.seconds,
        batch_size=args.batch_size,
        step_ms=args.step_ms,
        data_dir=args.data_dir,
        smoke=args.smoke,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
