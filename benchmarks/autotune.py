"""The self-tuned defaults against the best fixed settings, over a grid of scenarios.

``python -m benchmarks.autotune`` generates ImageNet-like JPEGs (:mod:`.data`) in two sizes
(``110k``: 500x375, about 110 KB; ``20k``: 200x150, about 20 KB), uploads them to a local
S3 server and, for each cell of the grid (``--sizes`` x ``--latencies`` ms through a
:class:`~concurrent_loader.testing.ProxyProcess` x ``--steps`` x ``--cores``), runs the loader
(``ImageFolder(image_size=224)``, shuffled, batch 32) once per setting:

- fixed: each ``num_workers`` in ``--workers`` x ``decode_threads`` in ``--threads`` x
  ``max_inflight_requests`` in ``--inflight``;
- ``auto``: each ``num_workers``, everything else left to the loader (self-tuned requests
  in flight and decode threads, batches in progress following the fetch limit);
- ``all auto``: ``num_workers="auto"`` as well (a process per core of the cell).

Each run is a fresh process pinned to the cell's cores (the last ``cores`` CPUs; the server
and the proxy are pinned to the first CPU, shared with the loader when it has them all),
and counts images over ``--seconds`` after its first batch. The step: ``none`` (the loop
only takes batches) or ``half`` (the loop busy-computes ``--step-ms`` of CPU per batch, half
a core at the rate at which a batch arrives every twice that). Reported per cell: images/s of
every setting, the best fixed one, and auto over it (best worker count for auto against the
best fixed setting at any worker count, and at each worker count), and all auto over it.
``--rounds`` repeats the cell's settings, interleaved, and takes medians. ``--smoke`` runs
one tiny cell for tests.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZE = 32
IMAGE_SIZE = 224
SIZES = {"110k": (500, 375), "20k": (200, 150)}
AUTO = "auto"
ALL_AUTO = "all auto"  # num_workers="auto" too


def _one(spec: dict[str, Any]) -> dict[str, Any]:
    """One run (in its own pinned process): images/s over ``seconds`` after the first batch."""
    import torch

    from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder
    from concurrent_loader.stores import S3Config

    store = S3Config.from_url(spec["url"], endpoint_url=spec["endpoint"], **spec["credentials"])
    fetch = FetchConfig(max_inflight_requests=spec["inflight"])
    dataset = ImageFolder(store, image_size=IMAGE_SIZE, fetch_config=fetch)
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=spec["workers"],
        decode_threads=spec["threads"],
        generator=torch.Generator().manual_seed(1),
    )
    step_s = spec["step_ms"] / 1000
    images, started, now = 0, None, time.perf_counter()
    while started is None or now - started < spec["seconds"]:
        for batch_images, _ in loader:
            now = time.perf_counter()
            if started is None:
                started = now
            else:
                images += len(batch_images)
            until = time.perf_counter() + step_s
            while time.perf_counter() < until:  # the step: CPU, not a sleep
                pass
            if now - started >= spec["seconds"]:
                break
    return {"images_per_s": images / (now - (started or now)), "tuning": loader.tuning}


def _run_pinned(spec: dict[str, Any], cpus: Sequence[int]) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.autotune", "--one", json.dumps(spec)]
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        ["taskset", "-c", ",".join(map(str, cpus)), *command],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=spec["seconds"] * 4 + 120,
    )
    if done.returncode:
        raise RuntimeError(f"run {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _settings(
    workers: Sequence[int], threads: Sequence[int], inflight: Sequence[int]
) -> list[tuple[int | str, int | None, int | None]]:
    fixed = list(itertools.product(workers, threads, inflight))
    return [*fixed, *((w, None, None) for w in workers), (AUTO, None, None)]


def _name(setting: tuple[int | str, int | None, int | None]) -> str:
    w, t, n = setting
    if w == AUTO:
        return ALL_AUTO
    return f"{w}w {AUTO}" if t is None else f"{w}w {t}t {n}"


def run(
    *,
    images: int = 2000,
    sizes: Sequence[str] = ("110k", "20k"),
    latencies: Sequence[float] = (0.0, 50.0, 200.0),
    steps: Sequence[str] = ("none", "half"),
    cores: Sequence[int] = (1, 2),
    workers: Sequence[int] = (1, 2),
    threads: Sequence[int] = (1, 2, 3),
    inflight: Sequence[int] = (64, 512),
    seconds: float = 6.0,
    step_ms: float = 25.0,
    rounds: int = 1,
    data_dir: Path | None = None,
    smoke: bool = False,
) -> dict[str, Any]:
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    from .data import DatasetSpec, ensure_local, ensure_uploaded

    if smoke:
        images, sizes, latencies, steps, cores = 64, ("20k",), (0.0,), ("half",), (1,)
        workers, threads, inflight, seconds, step_ms = (1,), (1,), (64,), 1.0, 5.0
    all_cpus = sorted(os.sched_getaffinity(0))
    report: dict[str, Any] = {"images": images, "seconds": seconds, "step_ms": step_ms}
    report["cells"] = cells = {}
    settings = _settings(workers, threads, inflight)
    # The server and the proxies, started below, inherit the first CPU; this process gets
    # its CPUs back when they have stopped (a caller, such as a test session, goes on).
    with _pinned(all_cpus[:1] if len(all_cpus) > 1 else all_cpus), LocalS3Server() as server:
        credentials = {
            "region": server.region,
            "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key,
        }
        for size in sizes:
            width, height = SIZES[size]
            spec = DatasetSpec(images=images, classes=10, width=width, height=height)
            local, _ = ensure_local(spec, data_dir or REPO_ROOT / ".bench" / "data")
            bucket, _ = ensure_uploaded(local, server)
            for latency in latencies:
                with ProxyProcess(server.endpoint_url, latency_ms=latency) as proxy:
                    for step, n_cores in itertools.product(steps, cores):
                        cpus = all_cpus[-n_cores:]
                        rates: dict[str, list[float]] = {}
                        tuned: dict[str, Any] = {}
                        for _ in range(rounds):
                            for setting in settings:
                                w, t, n = setting
                                result = _run_pinned(
                                    {
                                        "url": f"s3://{bucket}/train/",
                                        "endpoint": proxy.endpoint_url,
                                        "credentials": credentials,
                                        "workers": w,
                                        "threads": t,
                                        "inflight": n,
                                        "seconds": seconds,
                                        "step_ms": step_ms if step == "half" else 0.0,
                                    },
                                    cpus,
                                )
                                rates.setdefault(_name(setting), []).append(result["images_per_s"])
                                if t is None:
                                    tuned[_name(setting)] = result["tuning"]
                        name = f"{size}, +{latency:g} ms, step {step}, {n_cores} cores"
                        cells[name] = _cell(rates, tuned, workers, local.mean_object_bytes)
    return report


@contextlib.contextmanager
def _pinned(cpus: Sequence[int]) -> Iterator[None]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _cell(
    rates: dict[str, list[float]],
    tuned: dict[str, Any],
    workers: Sequence[int],
    object_bytes: float,
) -> dict[str, Any]:
    medians = {name: statistics.median(v) for name, v in rates.items()}
    fixed = {k: v for k, v in medians.items() if AUTO not in k}
    auto = {k: v for k, v in medians.items() if AUTO in k and k != ALL_AUTO}
    best = max(fixed, key=fixed.__getitem__)
    best_auto = max(auto, key=auto.__getitem__)
    per_workers = {}
    for w in workers:
        mine = {k: v for k, v in fixed.items() if k.startswith(f"{w}w ")}
        per_workers[f"{w}w"] = medians[f"{w}w {AUTO}"] / max(mine.values())
    return {
        "object_kb": object_bytes / 1e3,
        "images_per_s": medians,
        "best_fixed": best,
        "best_auto": best_auto,
        "auto / best": auto[best_auto] / fixed[best],
        "auto / best at the same workers": per_workers,
        "all auto / best": medians[ALL_AUTO] / fixed[best],
        "auto tuning": tuned,
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{report['images']} images per size, {report['seconds']:g} s per run"]
    for name, cell in report["cells"].items():
        same = ", ".join(f"{w} {r:.2f}" for w, r in cell["auto / best at the same workers"].items())
        lines.append(
            f"{name} ({cell['object_kb']:.0f} KB): best fixed {cell['best_fixed']} "
            f"{cell['images_per_s'][cell['best_fixed']]:.0f} img/s; {cell['best_auto']} "
            f"{cell['images_per_s'][cell['best_auto']]:.0f}: {cell['auto / best']:.3f}x "
            f"(same workers: {same}); all auto {cell['images_per_s'][ALL_AUTO]:.0f}: "
            f"{cell['all auto / best']:.3f}x"
        )
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.autotune", description=__doc__)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a single run, as JSON
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--sizes", default="110k,20k")
    parser.add_argument("--latencies", default="0,50,200", help="ms, comma separated")
    parser.add_argument("--steps", default="none,half")
    parser.add_argument("--cores", default="1,2")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--threads", default="1,2,3")
    parser.add_argument("--inflight", default="64,512")
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="each run, after its first batch"
    )
    parser.add_argument("--step-ms", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for tests")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.one:
        print(json.dumps(_one(json.loads(args.one))))
        return 0
    report = run(
        images=args.images,
        sizes=args.sizes.split(","),
        latencies=_floats(args.latencies),
        steps=args.steps.split(","),
        cores=[int(v) for v in args.cores.split(",")],
        workers=[int(v) for v in args.workers.split(",")],
        threads=[int(v) for v in args.threads.split(",")],
        inflight=[int(v) for v in args.inflight.split(",")],
        seconds=args.seconds,
        step_ms=args.step_ms,
        rounds=args.rounds,
        data_dir=args.data_dir,
        smoke=args.smoke,
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
