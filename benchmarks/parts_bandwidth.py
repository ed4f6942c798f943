"""One large object at link speed: ranged GETs in flight against one GET, under bandwidth caps.

    python -m benchmarks.parts_bandwidth [--smoke] [--big-mb 256] [--total-cap-mib 64] ...

One ``--big-mb`` object on a local S3 server, read by one worker of
``ConcurrentDataLoader`` through a proxy (+``--latency-ms``) that caps the bandwidth in
total (``--total-cap-mib``: the link) and, separately, per connection (``--conn-cap-mib``:
what one TCP stream gets from a store far away), in parts (``--part-mib`` x
``--parts-in-flight``, :mod:`concurrent_loader.fetch.parts`) and with one GET. Each row is
the second of two passes (the first also starts the worker), checked against the object's
CRC-32, in MiB/s and as a share of the cap. Also run by ``benchmarks.shards_peers``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset
from concurrent_loader.fetch.parts import PartsConfig
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import LocalS3Server, ProxyProcess

MiB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--big-mb", type=int, default=256, help="the large object (MiB)")
    parser.add_argument("--total-cap-mib", type=float, default=64.0, help="MiB/s, in total")
    parser.add_argument("--conn-cap-mib", type=float, default=16.0, help="MiB/s, per connection")
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--parts-in-flight", type=int, default=8)


def smoke(args: argparse.Namespace) -> None:
    args.big_mb, args.part_mib, args.total_cap_mib, args.conn_cap_mib = 8, 1, 32.0, 16.0


def run_bandwidth(s3: LocalS3Server, bucket: str, args: argparse.Namespace) -> dict[str, Any]:
    """One ``--big-mb`` object through each cap, read in parts and with one GET."""
    size = args.big_mb * MiB
    data = os.urandom(size)
    crc = zlib.crc32(data)
    s3.put_object(bucket, "big/object.bin", data)
    del data
    rows: dict[str, Any] = {}
    caps = {
        "total": {"total_bandwidth": args.total_cap_mib * MiB},
        "per-connection": {"bandwidth_bytes_per_s": args.conn_cap_mib * MiB},
    }
    for cap_name, cap in caps.items():
        cap_bytes = next(iter(cap.values()))
        with ProxyProcess(s3.endpoint_url, latency_ms=args.latency_ms, **cap) as proxy:
            for mode, parts in (
                ("parts", PartsConfig(args.part_mib * MiB, args.parts_in_flight)),
                ("one GET", PartsConfig(enabled=False)),
            ):
                dataset = ObjectDataset(
                    S3Config.from_url(f"s3://{bucket}/big/", endpoint_url=proxy.endpoint_url),
                    decode=zlib.crc32,
                    fetch_config=FetchConfig(max_object_bytes=2 * size),
                    parts=parts,
                )
                loader = ConcurrentDataLoader(
                    dataset, batch_size=1, num_workers=1, persistent_workers=True
                )
                passes = []
                for _ in range(2):
                    started = time.perf_counter()
                    [got] = list(loader)
                    passes.append(time.perf_counter() - started)
                    if int(got) != crc:
                        raise AssertionError(f"{cap_name}/{mode}: the object's bytes differ")
                del loader
                mib_s = size / passes[1] / MiB
                rows[f"{cap_name} cap, {mode}"] = {
                    "mib_per_s": mib_s,
                    "cap_mib_per_s": cap_bytes / MiB,
                    "share_of_cap": mib_s * MiB / cap_bytes,
                }
                print(
                    f"{cap_name} cap {cap_bytes / MiB:.0f} MiB/s, {mode}: {mib_s:.1f} MiB/s "
                    f"({mib_s * MiB / cap_bytes:.0%})",
                    flush=True,
                )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: correctness only")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        smoke(args)
    with LocalS3Server() as s3:
        s3.create_bucket("parts-bench")
        for name, value in s3.env().items():
            os.environ[name] = value
        rows = run_bandwidth(s3, "parts-bench", args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parts_bandwidth.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
