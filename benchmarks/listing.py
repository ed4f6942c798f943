"""Listing a large root: by prefixes in parallel (``list_store``, ``delimiter_listing``)
against the sequential listing, measured in the same run on the same server.

The root holds ``--classes`` x ``--per-class`` keys shaped like ImageNet's
(``train/n01440764/n01440764_10026.JPEG``), one sub-prefix per class: a tree of empty
files made under ``/dev/shm`` (or the temp directory), served by ``rclone serve s3``
(:class:`~concurrent_loader.testing.RcloneS3Server`, no ETag hashing) through the
project's proxy adding ``--latency-ms`` to every request, and removed afterwards. Each
listing opens its own store; both lists must hold the same keys in the same order, else
the run fails. Three listings: ``parallel`` (``list_store``), ``sequential`` (the
store's ``list()``: aiobotocore's pages one after another, as before parallel listing)
and ``sequential_own_pages`` (the pages one after another, read as the parallel listing
reads each: the part of the gain that is not parallelism). The figures: seconds of each
(``--repeats`` times, the median reported), keys per second, the ratios, and the CPU
seconds of the client, the server and the proxy per listing.

    python -m benchmarks.listing                       # 1,000 x 1,000 keys at +50 ms
    python -m benchmarks.listing --smoke               # 20 x 60 keys at +5 ms (CI)
    python -m benchmarks.listing --classes 200 --skip-sequential

``run()`` does the same from Python and returns the report (the smoke test calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from concurrent_loader import FetchConfig
from concurrent_loader.listing import list_store
from concurrent_loader.runtime import acquire_runtime
from concurrent_loader.stores.base import ObjectInfo
from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.testing import ProxyProcess, RcloneS3Server, process_cpu_seconds

BUCKET = "imagenet"
ROOT = "train/"


def class_name(index: int) -> str:
    return f"n{1440764 + index:08d}"


def make_tree(data_dir: Path, classes: int, per_class: int) -> int:
    """Empty files ``BUCKET/train/<class>/<class>_<n>.JPEG``; returns how many."""
    mode = 0o644 | stat.S_IFREG
    for c in range(classes):
        name = class_name(c)
        folder = data_dir / BUCKET / ROOT / name
        folder.mkdir(parents=True)
        for n in range(per_class):
            os.mknod(folder / f"{name}_{10026 + n}.JPEG", mode)
    return classes * per_class


def sequential(config: S3Config, fetch: FetchConfig) -> list[ObjectInfo]:
    """The listing as it was: one paginated sequence, then sorted as ``list_store`` sorts."""

    async def collect() -> list[ObjectInfo]:
        store = config.open(fetch)
        try:
            return [info async for info in store.list() if not info.key.endswith("/")]
        finally:
            await store.close()

    runtime = acquire_runtime()
    try:
        found: list[ObjectInfo] = runtime.run(collect())
    finally:
        runtime.release()
    found.sort(key=lambda item: item.key)
    return found


def sequential_pages(config: S3Config, fetch: FetchConfig) -> list[ObjectInfo]:
    """One sequence of pages as the parallel listing reads each (the store's own signed
    GETs and XML reading), sorted: what the parallel listing gains by itself."""

    async def collect() -> list[ObjectInfo]:
        store = config.open(fetch)
        try:
            level = await store.list_level("", delimited=False)
            return [info for info in level.objects if not info.key.endswith("/")]
        finally:
            await store.close()

    runtime = acquire_runtime()
    try:
        found: list[ObjectInfo] = runtime.run(collect())
    finally:
        runtime.release()
    found.sort(key=lambda item: item.key)
    return found


def _timed(
    label: str, list_once: Any, repeats: int, pids: dict[str, int]
) -> tuple[list[float], list[ObjectInfo], dict[str, float]]:
    """``list_once()`` ``repeats`` times: wall seconds of each, the last list, and the CPU
    seconds per listing of this process (the client) and of each of ``pids``."""
    times, found = [], []
    cpu_before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
    client_before = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        found = list_once()
        times.append(time.perf_counter() - start)
        print(f"  {label}: {len(found)} keys in {times[-1]:.2f} s", file=sys.stderr)
    cpu = {
        name: (process_cpu_seconds(pid) - cpu_before[name]) / repeats for name, pid in pids.items()
    }
    cpu["client"] = (time.process_time() - client_before) / repeats
    return times, found, cpu


def run(
    *,
    classes: int = 1000,
    per_class: int = 1000,
    latency_ms: float = 50.0,
    width: int = 64,
    repeats: int = 1,
    skip_sequential: bool = False,
    smoke: bool = False,
) -> dict[str, Any]:
    if smoke:
        classes, per_class, latency_ms, repeats = 20, 60, 5.0, 1
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = Path(tempfile.mkdtemp(prefix="concurrent-loader-listing-", dir=base))
    try:
        start = time.perf_counter()
        keys = make_tree(tmp, classes, per_class)
        made_s = time.perf_counter() - start
        print(f"made {keys} empty files under {tmp} in {made_s:.1f} s", file=sys.stderr)
        with (
            RcloneS3Server(tmp, etag_hash="") as server,
            ProxyProcess(server.endpoint_url, latency_ms=latency_ms) as proxy,
        ):
            config = S3Config.from_url(
                f"s3://{BUCKET}/{ROOT}",
                endpoint_url=proxy.endpoint_url,
                region=server.region,
                aws_access_key_id=server.access_key,
                aws_secret_access_key=server.secret_key,
            ).resolved()
            fetch = FetchConfig(max_inflight_requests=width)
            pids = {"server": server.pid, "proxy": proxy.pid}
            parallel_s, parallel, parallel_cpu = _timed(
                "parallel", lambda: list_store(config, fetch), repeats, pids
            )
            report: dict[str, Any] = {
                "keys": keys,
                "classes": classes,
                "latency_ms": latency_ms,
                "width": width,
                "parallel_s": statistics.median(parallel_s),
                "parallel_keys_per_s": keys / statistics.median(parallel_s),
                "parallel_cpu_s": parallel_cpu,
            }
            if len(parallel) != keys:
                raise AssertionError(f"the parallel listing found {len(parallel)} of {keys} keys")
            if not skip_sequential:
                sequential_s, listed, sequential_cpu = _timed(
                    "sequential", lambda: sequential(config, fetch), repeats, pids
                )
                if listed != parallel:
                    raise AssertionError("the parallel listing differs from the sequential one")
                report["sequential_s"] = statistics.median(sequential_s)
                report["sequential_keys_per_s"] = keys / report["sequential_s"]
                report["sequential_cpu_s"] = sequential_cpu
                report["speedup"] = report["sequential_s"] / report["parallel_s"]
                pages_s, listed, pages_cpu = _timed(
                    "sequential, own pages", lambda: sequential_pages(config, fetch), repeats, pids
                )
                if listed != parallel:
                    raise AssertionError("the parallel listing differs from the sequential one")
                report["sequential_own_pages_s"] = statistics.median(pages_s)
                report["sequential_own_pages_cpu_s"] = pages_cpu
                report["speedup_over_own_pages"] = (
                    report["sequential_own_pages_s"] / report["parallel_s"]
                )
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1000, help="sub-prefixes (classes)")
    parser.add_argument("--per-class", type=int, default=1000, help="keys per class")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="added per request")
    parser.add_argument("--width", type=int, default=64, help="max_inflight_requests")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for CI")
    args = parser.parse_args(argv)
    report = run(
        classes=args.classes,
        per_class=args.per_class,
        latency_ms=args.latency_ms,
        width=args.width,
        repeats=args.repeats,
        skip_sequential=args.skip_sequential,
        smoke=args.smoke,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
