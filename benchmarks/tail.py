"""The tail benchmark: one epoch through the fault proxy, without and with faults.

``python -m benchmarks.tail`` starts a local S3 server, uploads ``--objects`` objects of 2-60
KB (random bytes, seeded), and reads them all as one shuffled epoch with ``--workers``
loader workers through a :class:`~concurrent_loader.testing.ProxyProcess` that adds an
S3-like latency (``--preset``: a first byte after 30 ms at the median, 200 ms at p99, 0.5 %
of GETs 2 s late), in three runs:

- ``clean``: latency only;
- ``faults``: the fault matrix on top (10 % 503 SlowDown, 5 % resets before and during the
  body, 2 % truncated bodies, 1 % stalls after the headers for ``--stall-seconds``);
- ``faults, not hedged``: the same with ``FetchConfig.hedge`` turned off.

Every run checks that each sample arrived once, byte-identical, in the sampler's order (the
benchmark fails otherwise), then reports the epoch's wall time, the training loop's p50 and
p99 wait per batch, and the loader's retries, throttles and hedges; the last lines give the
ratio of each faulty run's epoch time to the clean one's. Fetch settings are the library's
defaults unless ``--read-timeout`` is given.

``--smoke`` runs a tiny version (40 objects, stalls of 1 s and a 1 s read timeout) for tests:
it proves the harness works and its figures are finite, nothing about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
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


def _epoch(
    server: Any,
    proxy: Any,
    keys: list[str],
    digests: dict[str, str],
    *,
    workers: int,
    seed: int,
    fetch_config: Any,
) -> dict[str, Any]:
    """One shuffled epoch; checks every sample, returns its figures."""
    import torch

    from concurrent_loader import ConcurrentDataLoader, ObjectDataset

    ds = ObjectDataset(
        f"s3://{BUCKET}/{PREFIX}",
        keys,
        endpoint_url=proxy.endpoint_url,
        region=server.region,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        decode=_digest,
        fetch_config=fetch_config,
    )
    # A seeded permutation as the sampler: the expected batches are its chunks.
    order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(seed)).tolist()
    loader = ConcurrentDataLoader(ds, batch_size=BATCH_SIZE, sampler=order, num_workers=workers)
    started = time.perf_counter()
    batches = [list(batch) for batch in loader]
    seconds = time.perf_counter() - started
    want = [
        [digests[keys[i]] for i in order[start : start + BATCH_SIZE]]
        for start in range(0, len(order), BATCH_SIZE)
    ]
    if batches != want:
        wrong = next(i for i, (a, b) in enumerate(zip(batches, want, strict=False)) if a != b)
        raise AssertionError(f"batch {wrong} is not the sampler's batch, byte for byte")
    stats = loader.stats()
    proxy_stats = proxy.stats()
    return {
        "epoch_s": seconds,
        "wait_p50_ms": (stats["wait_s_per_batch"]["p50"] or 0.0) * 1000,
        "wait_p99_ms": (stats["wait_s_per_batch"]["p99"] or 0.0) * 1000,
        "gets_sent": proxy_stats["requests_by_method"].get("GET", 0),
        "faults": sum(proxy_stats["faults"].values()),
        "stragglers": proxy_stats["stragglers"],
        **{name: stats[name] for name in ("retries", "throttles", "hedges", "hedges_won")},
    }


def run(
    *,
    objects: int = 800,
    workers: int = 2,
    seed: int = 0,
    preset: str = "s3-like",
    stall_seconds: float = 30.0,
    read_timeout: float | None = None,
    smoke: bool = False,
) -> dict[str, Any]:
    """Every run's figures and the ratios of faulty to clean epoch time."""
    from concurrent_loader import FetchConfig, HedgeConfig, Timeouts
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    if smoke:
        objects, stall_seconds, read_timeout = min(objects, 40), 1.0, 1.0
    config = FetchConfig()
    if read_timeout is not None:
        config = dataclasses.replace(config, timeouts=Timeouts(read=read_timeout))
    bodies = make_objects(objects, seed)
    keys = sorted(bodies)
    digests = {key: _digest(body) for key, body in bodies.items()}
    runs = {
        "clean": (None, config),
        "faults": (fault_matrix(seed, stall_seconds), config),
        "faults, not hedged": (
            fault_matrix(seed, stall_seconds),
            dataclasses.replace(config, hedge=HedgeConfig(enabled=False)),
        ),
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tail-bench-") as tmp, LocalS3Server() as server:
        root = Path(tmp) / "objects"
        root.mkdir()
        for key, body in bodies.items():
            (root / key).write_bytes(body)
        server.create_bucket(BUCKET)
        server.upload_dir(root, BUCKET, prefix=PREFIX)
        for name, (faults, fetch_config) in runs.items():
            with ProxyProcess(server.endpoint_url, preset=preset, faults=faults) as proxy:
                results[name] = _epoch(
                    server,
                    proxy,
                    keys,
                    digests,
                    workers=workers,
                    seed=seed,
                    fetch_config=fetch_config,
                )
    clean = results["clean"]["epoch_s"]
    return {
        "objects": objects,
        "workers": workers,
        "preset": preset,
        "stall_seconds": stall_seconds,
        "read_timeout_s": config.timeouts.read,
        "runs": results,
        "ratios": {name: r["epoch_s"] / clean for name, r in results.items() if name != "clean"},
    }


def format_report(report: dict[str, Any]) -> str:
    head = (
        f"{report['objects']} objects of 2-60 KB, {report['workers']} workers, "
        f"latency {report['preset']}, stalls {report['stall_seconds']:g} s, "
        f"read timeout {report['read_timeout_s']:g} s"
    )
    columns = (
        "epoch_s",
        "wait_p50_ms",
        "wait_p99_ms",
        "gets_sent",
        "faults",
        "stragglers",
        "retries",
        "throttles",
        "hedges",
        "hedges_won",
    )
    lines = [head, f"{'run':<20}" + "".join(f"{c:>12}" for c in columns)]
    for name, figures in report["runs"].items():
        cells = "".join(
            f"{figures[c]:>12.2f}" if isinstance(figures[c], float) else f"{figures[c]:>12}"
            for c in columns
        )
        lines.append(f"{name:<20}{cells}")
    for name, ratio in report["ratios"].items():
        lines.append(f"epoch time, {name} / clean: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tail",
        description="One epoch through the fault proxy, without and with faults.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--objects", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="s3-like", help="the proxy's latency preset")
    parser.add_argument("--stall-seconds", type=float, default=30.0)
    parser.add_argument(
        "--read-timeout", type=float, default=None, help="Timeouts.read (default: the library's)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for tests")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    report = run(
        objects=args.objects,
        workers=args.workers,
        seed=args.seed,
        preset=args.preset,
        stall_seconds=args.stall_seconds,
        read_timeout=args.read_timeout,
        smoke=args.smoke,
    )
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
