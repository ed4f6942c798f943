"""Whole epochs: ``ConcurrentDataLoader`` over S3 against the same loader over local disk,
with and without ``persistent_workers``, epoch boundaries and cold starts included.

The main benchmark (``python -m benchmarks``) times a steady-state window inside one epoch;
a training run also pays each epoch's start: ``iter()`` to the first batch (worker start,
fetch clients, the first round trips) and the drain at its end. This one times every epoch
whole, from ``iter(loader)`` to its last batch, for several epochs in a row:

- ``images_per_s`` of each epoch (its images over its wall-clock seconds) and their mean;
- ``first_batch_s``: ``iter(loader)`` to the first batch, per epoch; the comparison gives
  its median over all epochs and, apart, over the first epoch of each run (the cold start:
  new workers, no connections, nothing fetched ahead);
- ``cpu_ms_per_image``: CPU (user + system) of the loader's processes, main and workers,
  per image of the epoch: with the client CPUs saturated it bounds the throughput;
- where that CPU went: ``main_cpu_ms`` and ``workers_cpu_ms`` per epoch (the main process,
  all its threads; the workers, from the process tree less the main process), with the
  minor page faults of each (``main_faults``, ``workers_faults``: a fresh page, or a page
  shared with a forked process written to, costs one), and ``fault_us``, the CPU one such
  fault costs on this machine, measured in each run's process before its loader starts.
  The comparison gives S3's extra per epoch, process by process. Workers that end with
  their epoch are counted once reaped (``RUSAGE_CHILDREN``, to the microsecond); persistent
  ones are read live from ``/proc``, whose CPU times are in clock ticks (10 ms), so their
  per-epoch CPU is that coarse (their faults are exact counts).

Setup as in the main benchmark: the generated JPEG dataset (:mod:`benchmarks.data`),
``ImageFolder(..., image_size=224)``, ``shuffle=True`` with a seeded ``generator``; the
S3 server and the latency proxy in front of it pinned to the storage CPUs, each run in a
fresh subprocess pinned to the client CPUs (its workers inherit the pinning). Every run
(one configuration, all its epochs) is one subprocess; repeats are interleaved, and each
pair of runs (S3 and local disk, same persistence) goes in the opposite order in the next
repeat (S3 first, then local first, ...), so that a drift of the machine's speed, or a run
slowed for being the first after a pause, weighs on both sides alike. ``ratio_per_repeat``
gives the pair's ratio for each repeat, next to the ratio over all of them::

    flock /tmp/bench.lock python -m benchmarks.epochs --images 480,2000 --epochs 5

``--smoke`` runs a tiny version (the CI test does); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPO_ROOT))

REGION = "us-east-1"
# (storage, persistent_workers), in the order runs are made within an even repeat; an odd
# repeat swaps each pair (see _order).
CONFIGS = (("s3", False), ("local", False), ("s3", True), ("local", True))


def _order(repeat: int) -> list[tuple[str, bool]]:
    """The runs of repeat number ``repeat``: ``CONFIGS``, each S3/local pair swapped in odd
    repeats (ABBA), so neither storage always runs first."""
    if repeat % 2 == 0:
        return list(CONFIGS)
    return [c for pair in zip(CONFIGS[1::2], CONFIGS[0::2], strict=True) for c in pair]


SMOKE = {
    "images": "48",
    "classes": 4,
    "batch_size": 8,
    "epochs": 2,
    "latency_ms": 5.0,
    "image_size": 32,
}


# ---------------------------------------------------------------------------- one run


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration's epochs, in this (pinned) process: what ``--run`` executes."""
    from benchmarks.measure import (
        _check_batch,
        own_usage,
        page_fault_us,
        pin_to,
        process_tree_usage,
    )

    affinity = pin_to(spec["client_cpus"])
    fault_us = page_fault_us()
    import torch

    from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder
    from concurrent_loader.stores import S3Config

    fetch_config = FetchConfig(max_inflight_requests=spec["max_inflight_requests"])
    if spec["storage"] == "s3":
        dataset = ImageFolder(
            S3Config.from_url(spec["s3_url"], endpoint_url=spec["endpoint_url"]),
            image_size=spec["image_size"],
            fetch_config=fetch_config,
        )
    else:
        dataset = ImageFolder(
            spec["local_dir"], image_size=spec["image_size"], fetch_config=fetch_config
        )
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=spec["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(spec["seed"]),
        num_workers=spec["workers"],
        persistent_workers=spec["persistent"],
    )
    epochs = []
    for epoch in range(spec["epochs"]):
        (cpu, faults), (main_cpu, main_faults) = process_tree_usage(), own_usage()
        started = time.perf_counter()
        iterator = iter(loader)
        images = _check_batch(next(iterator), spec["image_size"])
        first = time.perf_counter()
        for batch in iterator:
            images += _check_batch(batch, spec["image_size"])
        ended = time.perf_counter()
        # Workers that end with the iterator are counted once reaped (RUSAGE_CHILDREN).
        del iterator
        (cpu_after, faults_after), (main_cpu_after, main_faults_after) = (
            process_tree_usage(),
            own_usage(),
        )
        cpu, faults = cpu_after - cpu, faults_after - faults
        main_cpu, main_faults = main_cpu_after - main_cpu, main_faults_after - main_faults
        if images != len(dataset):
            raise RuntimeError(f"an epoch gave {images} images of {len(dataset)}")
        epochs.append(
            {
                "epoch": epoch,
                "images": images,
                "seconds": ended - started,
                "images_per_s": images / (ended - started),
                "first_batch_s": first - started,
                "cpu_ms_per_image": cpu / images * 1000,
                "main_cpu_ms": main_cpu * 1000,
                "workers_cpu_ms": (cpu - main_cpu) * 1000,
                "main_faults": main_faults,
                "workers_faults": faults - main_faults,
            }
        )
    del loader
    return {"epochs": epochs, "affinity": affinity, "fault_us": fault_us}


# ---------------------------------------------------------------------------- the driver


@contextlib.contextmanager
def _storage(args: argparse.Namespace, images: int) -> Iterator[dict[str, Any]]:
    """The dataset on disk and in the S3 server, behind the latency proxy."""
    from benchmarks.data import DatasetSpec, ensure_local, ensure_uploaded
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    spec = DatasetSpec(images=images, classes=min(args.classes, images), seed=args.seed)
    local, _ = ensure_local(spec, args.data_dir)
    args.s3_dir.mkdir(parents=True, exist_ok=True)
    cpus = set(args.storage_cpus)
    with LocalS3Server(data_dir=args.s3_dir, cpus=cpus) as server:
        bucket, _ = ensure_uploaded(local, server)
        with ProxyProcess(
            upstream=server.endpoint_url, latency_ms=args.latency_ms, cpus=cpus
        ) as proxy:
            env = dict(os.environ)
            env.update(server.env())
            env["PYTHONPATH"] = os.pathsep.join(
                [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
            env["AWS_ENDPOINT_URL"] = proxy.endpoint_url
            env["AWS_EC2_METADATA_DISABLED"] = "true"
            env.setdefault("AWS_REGION", REGION)
            yield {
                "env": env,
                "s3_url": f"s3://{bucket}/train/",
                "endpoint_url": proxy.endpoint_url,
                "local_dir": str(local.train_dir.resolve()),
            }


def _run_in_subprocess(spec: dict[str, Any], env: dict[str, str], timeout: float) -> Any:
    with tempfile.TemporaryDirectory(prefix="bench-epochs-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.epochs", "--run", str(spec_path), str(out_path)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not out_path.exists():
            tail = done.stderr.decode(errors="replace")[-3000:]
            raise RuntimeError(f"run {spec['storage']} failed ({done.returncode}):\n{tail}")
        return json.loads(out_path.read_text())


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every configuration at every dataset size: one row per (size, storage, persistent)."""
    rows: list[dict[str, Any]] = []
    for images in args.images:
        with _storage(args, images) as where:
            found: dict[tuple[str, bool], list[dict[str, Any]]] = {c: [] for c in CONFIGS}
            for repeat in range(args.repeats):
                for storage, persistent in _order(repeat):
                    spec = {
                        "storage": storage,
                        "persistent": persistent,
                        "client_cpus": args.client_cpus,
                        "image_size": args.image_size,
                        "batch_size": args.batch_size,
                        "workers": args.workers,
                        "epochs": args.epochs,
                        "seed": args.seed,
                        "max_inflight_requests": args.max_inflight_requests,
                        "s3_url": where["s3_url"],
                        "endpoint_url": where["endpoint_url"],
                        "local_dir": where["local_dir"],
                    }
                    result = _run_in_subprocess(spec, where["env"], args.run_timeout)
                    for epoch in result["epochs"]:
                        epoch["repeat"] = repeat
                        epoch["fault_us"] = result["fault_us"]
                    found[(storage, persistent)].extend(result["epochs"])
                    rates = ", ".join(f"{e['images_per_s']:.0f}" for e in result["epochs"])
                    print(f"{images} {storage} persistent={persistent}: {rates} img/s", flush=True)
            for (storage, persistent), epochs in found.items():
                rows.append(_row(images, storage, persistent, epochs))
    return rows


#: per-epoch figures of each process kind, whose S3 - local difference the comparison gives
_SPLIT = ("main_cpu_ms", "workers_cpu_ms", "main_faults", "workers_faults")


def _row(images: int, storage: str, persistent: bool, epochs: list[dict[str, Any]]) -> Any:
    rates = [e["images_per_s"] for e in epochs]
    firsts = [e["first_batch_s"] for e in epochs]
    return {
        "images": images,
        "storage": storage,
        "persistent": persistent,
        "epochs": epochs,
        # Over whole epochs: all images over all seconds (each epoch weighs its duration).
        "images_per_s": sum(e["images"] for e in epochs) / sum(e["seconds"] for e in epochs),
        "epoch_images_per_s": rates,
        # Robust to an epoch slowed by something else on the machine.
        "median_epoch_images_per_s": statistics.median(rates),
        "first_batch_s": firsts,
        "first_epoch_first_batch_s": [e["first_batch_s"] for e in epochs if e["epoch"] == 0],
        "cpu_ms_per_image": statistics.median(e["cpu_ms_per_image"] for e in epochs),
        # Per epoch, medians over the epochs: where the CPU went.
        **{key: statistics.median(e[key] for e in epochs) for key in _SPLIT},
        "fault_us": statistics.median(e["fault_us"] for e in epochs),
    }


def _whole_run(epochs: Sequence[dict[str, Any]], repeat: int) -> float:
    """Images per second over the epochs of one repeat's run."""
    mine = [e for e in epochs if e["repeat"] == repeat]
    return sum(e["images"] for e in mine) / sum(e["seconds"] for e in mine)


def compare(rows: Sequence[dict[str, Any]], latency_ms: float) -> list[dict[str, Any]]:
    """S3 against local disk, per size and persistence: the throughput ratio and the time to
    first batch (median over epochs), against the targets (>= 0.95x; <= local + 1.5 RTT)."""
    out = []
    by = {(r["images"], r["storage"], r["persistent"]): r for r in rows}
    for (images, storage, persistent), s3 in by.items():
        if storage != "s3" or (images, "local", persistent) not in by:
            continue
        local = by[(images, "local", persistent)]
        first_s3 = statistics.median(s3["first_batch_s"])
        first_local = statistics.median(local["first_batch_s"])
        cold_s3 = statistics.median(s3["first_epoch_first_batch_s"])
        cold_local = statistics.median(local["first_epoch_first_batch_s"])
        round_trips = 1.5 * latency_ms / 1000
        ratio = s3["images_per_s"] / local["images_per_s"]
        median_ratio = s3["median_epoch_images_per_s"] / local["median_epoch_images_per_s"]
        per_repeat = [
            _whole_run(s3["epochs"], repeat) / _whole_run(local["epochs"], repeat)
            for repeat in sorted({e["repeat"] for e in s3["epochs"]})
        ]
        out.append(
            {
                "images": images,
                "persistent": persistent,
                "ratio": ratio,
                "median_epoch_ratio": median_ratio,
                "ratio_per_repeat": per_repeat,
                "cpu_ms_per_image_s3": s3["cpu_ms_per_image"],
                "cpu_ms_per_image_local": local["cpu_ms_per_image"],
                # S3's extra per epoch, by process, and what its extra faults cost.
                **{f"{key}_extra": s3[key] - local[key] for key in _SPLIT},
                "fault_us": statistics.median([s3["fault_us"], local["fault_us"]]),
                "first_batch_s3_s": first_s3,
                "first_batch_local_s": first_local,
                "first_batch_extra_ms": (first_s3 - first_local) * 1000,
                "first_epoch_first_batch_s3_s": cold_s3,
                "first_epoch_first_batch_local_s": cold_local,
                "first_epoch_first_batch_extra_ms": (cold_s3 - cold_local) * 1000,
                "ratio_ok": ratio >= 0.95,
                "first_batch_ok": first_s3 - first_local <= round_trips,
                "first_epoch_first_batch_ok": cold_s3 - cold_local <= round_trips,
            }
        )
    return out


def format_table(rows: Sequence[dict[str, Any]], comparisons: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| images | storage | persistent_workers | img/s per epoch | img/s, whole run "
        "| iter() -> first batch, s, per epoch | client CPU ms/image (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_epoch = ", ".join(f"{v:.0f}" for v in r["epoch_images_per_s"])
        firsts = ", ".join(f"{v:.3f}" for v in r["first_batch_s"])
        lines.append(
            f"| {r['images']} | {r['storage']} | {r['persistent']} | {per_epoch} "
            f"| {r['images_per_s']:.0f} | {firsts} | {r['cpu_ms_per_image']:.2f} |"
        )
    lines += [
        "",
        "| images | persistent_workers | S3 / local, whole run (target >= 0.95) "
        "| per repeat | S3 / local, median epoch | client CPU ms/image, S3 vs local "
        "| first batch, median: S3 s, local s, S3 - local ms (target <= 1.5 RTT) "
        "| the same, first epoch of each run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        per_repeat = ", ".join(f"{v:.3f}" for v in c["ratio_per_repeat"])
        lines.append(
            f"| {c['images']} | {c['persistent']} | {c['ratio']:.3f} "
            f"{'(met)' if c['ratio_ok'] else '(missed)'} | {per_repeat} "
            f"| {c['median_epoch_ratio']:.3f} "
            f"| {c['cpu_ms_per_image_s3']:.2f} vs {c['cpu_ms_per_image_local']:.2f} "
            f"| {c['first_batch_s3_s']:.3f}, "
            f"{c['first_batch_local_s']:.3f}, {c['first_batch_extra_ms']:+.0f} "
            f"{'(met)' if c['first_batch_ok'] else '(missed)'} "
            f"| {c['first_epoch_first_batch_s3_s']:.3f}, "
            f"{c['first_epoch_first_batch_local_s']:.3f}, "
            f"{c['first_epoch_first_batch_extra_ms']:+.0f} "
            f"{'(met)' if c['first_epoch_first_batch_ok'] else '(missed)'} |"
        )
    lines += [
        "",
        "| images | persistent_workers | S3 - local per epoch (median): main process CPU ms "
        "| workers CPU ms | minor faults, main process | minor faults, workers "
        "| those extra faults at the measured cost per fault, ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        faults = c["main_faults_extra"] + c["workers_faults_extra"]
        lines.append(
            f"| {c['images']} | {c['persistent']} | {c['main_cpu_ms_extra']:+.0f} "
            f"| {c['workers_cpu_ms_extra']:+.0f} | {c['main_faults_extra']:+.0f} "
            f"| {c['workers_faults_extra']:+.0f} "
            f"| {faults * c['fault_us'] / 1000:+.1f} ({c['fault_us']:.2f} us each) |"
        )
    return "\n".join(lines)


def _cpus(text: str) -> list[int]:
    return [int(c) for c in text.split(",") if c.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", default="480,2000", help="dataset sizes, comma-separated")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--epochs", type=int, default=5, help="epochs per run")
    p.add_argument("--repeats", type=int, default=1, help="runs per configuration")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--max-inflight-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=50.0, help="first-byte delay per GET")
    p.add_argument("--client-cpus", type=_cpus, default=[0])
    p.add_argument("--storage-cpus", type=_cpus, default=[1])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".bench/data")
    p.add_argument("--s3-dir", type=Path, default=REPO_ROOT / ".bench/s3")
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--smoke", action="store_true", help="tiny CI run: " + json.dumps(SMOKE))
    p.add_argument("--run", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run:
        result = run(json.loads(Path(args.run[0]).read_text()))
        Path(args.run[1]).write_text(json.dumps(result))
        return 0
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    args.images = [int(n) for n in str(args.images).split(",") if n.strip()]
    available = sorted(os.sched_getaffinity(0))
    # A machine with one CPU cannot separate the two sides: share it.
    args.client_cpus = [c for c in args.client_cpus if c in available] or available[:1]
    args.storage_cpus = [c for c in args.storage_cpus if c in available] or available[-1:]
    rows = measure(args)
    comparisons = compare(rows, args.latency_ms)
    print(format_table(rows, comparisons))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "comparisons": comparisons}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
