"""What checking every body against its store's checksum costs.

Two questions:

1. **CPU per GET of each checksum**, at body sizes a loader sees (4 KB, an ImageNet-like
   110 KB JPEG, 1 MB, 8 MB): the implementations the loader uses
   (:data:`concurrent_loader.stores.checksum.ALGORITHMS`: ``anycrc`` for the CRCs,
   ``hashlib`` for SHA-1, SHA-256 and MD5) next to the alternatives that are importable
   here (``zlib.crc32``, ``google_crc32c``, ``crc32c``, ``awscrt``, ``isal``, ``zlib_ng``).
   Each figure is the best of ``repeats`` runs of the process CPU time per call.
2. **The whole fetch path** (``--fetch``), verification on and off: the fetch client's
   GETs of 110 KB objects (uploaded with boto3's default CRC32) from a local SeaweedFS,
   ``concurrency`` in flight, alternating on and off ``repeats`` times; the figure is this
   process's CPU time per GET (the server runs in its own process), median and range.

::

    python -m benchmarks.integrity                # checksums only
    python -m benchmarks.integrity --fetch        # and the fetch path against SeaweedFS
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from concurrent_loader.stores.checksum import ALGORITHMS

Digest = Callable[[bytes], object]
SIZES = (4_000, 110_000, 1_000_000, 8_000_000)
SMOKE_SIZES = (4_000, 110_000)


def _alternatives() -> dict[str, Digest]:
    """Other implementations of the same checksums, those importable here."""
    import zlib

    found: dict[str, Digest] = {"crc32 (zlib)": zlib.crc32}
    candidates = [
        ("crc32c (google_crc32c)", "google_crc32c", "value"),
        ("crc32c (crc32c)", "crc32c", "crc32c"),
        ("crc32 (awscrt)", "awscrt.checksums", "crc32"),
        ("crc32c (awscrt)", "awscrt.checksums", "crc32c"),
        ("crc64nvme (awscrt)", "awscrt.checksums", "crc64nvme"),
        ("crc32 (isal)", "isal.isal_zlib", "crc32"),
        ("crc32 (zlib_ng)", "zlib_ng.zlib_ng", "crc32"),
    ]
    for label, module, name in candidates:
        try:
            found[label] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return found


def _cpu_us_per_call(digest: Digest, data: bytes, repeats: int, budget_s: float) -> float:
    """Best of ``repeats`` runs: process CPU microseconds per call of ``digest(data)``."""
    digest(data)
    started = time.process_time()
    calls = 0
    while time.process_time() - started < budget_s / 10 or calls < 3:
        digest(data)
        calls += 1
    per_call = (time.process_time() - started) / calls
    calls = max(3, int(budget_s / repeats / max(per_call, 1e-9)))
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time_ns()
        for _ in range(calls):
            digest(data)
        best = min(best, (time.process_time_ns() - start) / calls / 1000)
    return best


def checksum_costs(sizes: Sequence[int], repeats: int, budget_s: float) -> dict[str, Any]:
    """``{implementation: {size: microseconds per call}}``, ours first."""
    implementations: dict[str, Digest] = {
        f"{name} (ours)": digest for name, digest in ALGORITHMS.items()
    }
    implementations.update(_alternatives())
    rows: dict[str, Any] = {}
    for label, digest in implementations.items():
        rows[label] = {
            str(size): _cpu_us_per_call(digest, os.urandom(size), repeats, budget_s)
            for size in sizes
        }
    return rows


async def _fetch_cpu(
    config: Any, keys: list[str], concurrency: int, fetch_config: Any
) -> tuple[float, int]:
    """(CPU seconds of this process, bytes) for one pass of GETs over ``keys``."""
    from concurrent_loader.fetch.client import FetchClient

    client = FetchClient(config.open(fetch_config), fetch_config)
    try:
        for key in keys[:concurrency]:  # connections warmed up, not measured
            await client.get(key)
        slots = asyncio.Semaphore(concurrency)
        total = 0

        async def one(key: str) -> None:
            nonlocal total
            async with slots:
                data = await client.get(key)
            total += len(data)

        started = time.process_time()
        await asyncio.gather(*(one(key) for key in keys))
        return time.process_time() - started, total
    finally:
        await client.close()


def fetch_costs(
    objects: int, size: int, concurrency: int, repeats: int, data_dir: Path | None
) -> dict[str, Any]:
    """CPU per GET of the fetch client, verification on and off, against SeaweedFS."""
    from concurrent_loader import FetchConfig
    from concurrent_loader.stores.s3 import S3Config
    from concurrent_loader.testing import LocalS3Server

    bucket = "integrity-bench"
    with (
        tempfile.TemporaryDirectory(prefix="integrity-bench-", dir=data_dir) as tmp,
        LocalS3Server(Path(tmp) / "s3") as server,
    ):
        server.create_bucket(bucket)
        client = server.client()  # boto3's default checksum: CRC32
        keys = [f"obj-{i:05d}.bin" for i in range(objects)]
        body = os.urandom(size)
        for key in keys:
            client.put_object(Bucket=bucket, Key=key, Body=body)
        client.close()
        fetch_config = FetchConfig(max_inflight_requests=concurrency)
        configs = {
            verify: S3Config.from_url(
                f"s3://{bucket}/",
                endpoint_url=server.endpoint_url,
                region=server.region,
                aws_access_key_id=server.access_key,
                aws_secret_access_key=server.secret_key,
                verify_checksums=verify,
            ).resolved()
            for verify in (False, True)
        }
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for verify in (False, True):
                cpu, total = asyncio.run(
                    _fetch_cpu(configs[verify], keys, concurrency, fetch_config)
                )
                if total != size * objects:
                    raise RuntimeError(f"{total} bytes read, not {size * objects}")
                runs[verify].append(cpu / objects * 1e6)
    row: dict[str, Any] = {}
    for verify, label in ((False, "off"), (True, "on")):
        values = runs[verify]
        row[label] = {
            "us_per_get": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
    row["extra_us_per_get"] = row["on"]["us_per_get"] - row["off"]["us_per_get"]
    row.update(objects=objects, size=size, concurrency=concurrency, repeats=repeats)
    return row


def run(
    *,
    smoke: bool = False,
    fetch: bool = False,
    repeats: int = 7,
    objects: int = 2000,
    concurrency: int = 32,
    data_dir: Path | None = None,
) -> dict[str, Any]:
    """Every figure as a dict (``format_report`` prints it)."""
    sizes = SMOKE_SIZES if smoke else SIZES
    report: dict[str, Any] = {
        "checksums_us": checksum_costs(
            sizes, repeats=3 if smoke else repeats, budget_s=0.02 if smoke else 0.5
        ),
        "sizes": list(sizes),
    }
    if fetch or smoke:
        report["fetch"] = fetch_costs(
            objects=60 if smoke else objects,
            size=110_000,
            concurrency=8 if smoke else concurrency,
            repeats=1 if smoke else repeats,
            data_dir=data_dir,
        )
    return report


def format_report(report: dict[str, Any]) -> str:
    sizes = report["sizes"]
    lines = [
        "CPU per GET of each checksum, microseconds (best of the runs)",
        f"{'implementation':26s}" + "".join(f"{size // 1000:>10d} KB" for size in sizes),
    ]
    for label, row in report["checksums_us"].items():
        lines.append(f"{label:26s}" + "".join(f"{row[str(size)]:>13.1f}" for size in sizes))
    fetch = report.get("fetch")
    if fetch:
        lines.append(
            f"\nFetch client, {fetch['objects']} GETs of {fetch['size'] // 1000} KB (CRC32), "
            f"{fetch['concurrency']} in flight, {fetch['repeats']} runs: CPU per GET, us"
        )
        for label in ("off", "on"):
            figure = fetch[label]
            lines.append(
                f"  verification {label:3s} {figure['us_per_get']:7.1f} "
                f"({figure['min']:.1f}-{figure['max']:.1f})"
            )
        lines.append(f"  extra with verification {fetch['extra_us_per_get']:+.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run, for the tests")
    parser.add_argument("--fetch", action="store_true", help="also the fetch path vs SeaweedFS")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    report = run(
        smoke=args.smoke,
        fetch=args.fetch,
        repeats=args.repeats,
        objects=args.objects,
        concurrency=args.concurrency,
    )
    print(format_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
