"""The cache benchmark: epochs after the first, read through the node-local cache.

``python -m benchmarks.cache`` generates the benchmark's JPEG dataset (:mod:`.data`), uploads
it to a local S3 server, and reads it with ``ImageFolder(..., image_size=224)`` through a
:class:`~concurrent_loader.testing.ProxyProcess`, ``--workers`` loader workers, shuffled. Three
rows, each measured within this one run:

- ``hits vs local disk``: epoch 2 of a loader whose cache holds the whole dataset (epoch 1
  filled it) against the same loader over the dataset's local directory (its page cache
  warmed by one epoch first); the two alternate ``--repeats`` times and the medians are
  compared. The GETs the proxy saw in the cached epochs are reported (the target is 0).
- ``half budget``: a fresh cache with ``max_bytes`` half the dataset's entry bytes, fill
  policy: the GETs of epoch 2, as a share of the dataset (the target is half).
- ``bandwidth cap``: the proxy capped at ``--bandwidth-mbit`` in total (each of a comma
  separated list); an epoch without the cache against the median of ``--repeats`` epochs
  after the first with it. The cached epoch runs
  at the decode's speed, so the ratio is that over the capped link's: on few cores a wide
  link is not the bottleneck to begin with.

Every epoch checks that it yielded each image once (the count and the label histogram);
the byte-for-byte checks are in ``tests/cache``. ``--smoke`` runs a tiny version for tests:
it proves the harness works and its figures are finite, nothing about speed.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZE = 64
IMAGE_SIZE = 224
LAST_STATS: dict[str, Any] = {}


def _epoch(dataset: Any, workers: int, seed: int, want: collections.Counter[int]) -> float:
    """Seconds for one shuffled epoch; fails unless every image came once. The loader's
    ``stats()`` are left in ``LAST_STATS``."""
    import torch

    from concurrent_loader import ConcurrentDataLoader

    loader = ConcurrentDataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
    )
    got: collections.Counter[int] = collections.Counter()
    started = time.perf_counter()
    for images, labels in loader:
        if images.shape[1:] != (3, IMAGE_SIZE, IMAGE_SIZE):
            raise AssertionError(f"a batch of shape {tuple(images.shape)}")
        got.update(labels.tolist())
    seconds = time.perf_counter() - started
    LAST_STATS.clear()
    LAST_STATS.update(loader.stats())
    if got != want:
        raise AssertionError(f"the epoch's labels {dict(got)} are not the dataset's {dict(want)}")
    return seconds


def _gets(proxy: Any) -> int:
    return int(proxy.stats()["requests_by_method"].get("GET", 0))


def _filled(dataset: Any, workers: int, seed: int, want: collections.Counter[int]) -> float:
    """The fill epoch; then its entries are written out to disk (``os.sync``), so the epochs
    timed next do not share the disk with the fill's writeback, as no later epoch would."""
    seconds = _epoch(dataset, workers, seed, want)
    os.sync()
    return seconds


def _reset_when_quiet(proxy: Any, quiet_s: float = 0.3, at_most_s: float = 10.0) -> None:
    """Zero the proxy's counters once the epoch before has left it: no request in flight and
    none new for ``quiet_s``. A hedge sent as that epoch ended can reach the proxy after the
    epoch's last batch, and would otherwise be counted as the next epoch's GET."""
    deadline = time.monotonic() + at_most_s
    seen = proxy.stats()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = proxy.stats()
        if now["inflight"] == 0 and now["requests"] == seen["requests"]:
            break
        seen = now
    proxy.reset_stats()


def run(
    *,
    images: int = 1000,
    workers: int = 2,
    repeats: int = 3,
    bandwidth_mbit: Sequence[float] = (200.0,),
    seed: int = 0,
    data_dir: Path | None = None,
    smoke: bool = False,
) -> dict[str, Any]:
    """Every row's figures (see the module docstring)."""
    from concurrent_loader import ImageFolder
    from concurrent_loader.cache import CacheConfig, describe_cache
    from concurrent_loader.stores import S3Config
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    from .data import DatasetSpec, ensure_local, ensure_uploaded

    if smoke:
        images, repeats, workers = min(images, 48), 1, min(workers, 2)
    spec = DatasetSpec(images=images, classes=4 if smoke else 10, seed=seed)
    local, _ = ensure_local(spec, data_dir or REPO_ROOT / ".bench" / "data")
    report: dict[str, Any] = {
        "images": images,
        "dataset_mb": local.total_bytes / 1e6,
        "workers": workers,
        "repeats": repeats,
        "bandwidth_mbit": list(bandwidth_mbit),
    }
    with tempfile.TemporaryDirectory(prefix="cache-bench-") as tmp, LocalS3Server() as server:
        bucket, _ = ensure_uploaded(local, server)
        credentials = {
            "region": server.region,
            "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key,
        }
        root = f"s3://{bucket}/train/"
        on_disk = ImageFolder(local.train_dir, image_size=IMAGE_SIZE)
        want = collections.Counter(on_disk.targets.tolist())

        def s3_folder(proxy: Any, cache: Any) -> Any:
            return ImageFolder(
                S3Config.from_url(root, endpoint_url=proxy.endpoint_url, **credentials),
                image_size=IMAGE_SIZE,
                cache=cache,
            )

        # 1. hits vs local disk
        with ProxyProcess(server.endpoint_url) as proxy:
            cached = s3_folder(proxy, str(Path(tmp) / "full"))
            fill_s = _filled(cached, workers, seed, want)
            filled = describe_cache(str(Path(tmp) / "full"))
            _epoch(on_disk, workers, seed, want)  # the page cache, for the local runs
            _reset_when_quiet(proxy)
            local_s, hit_s = [], []
            cache_misses = 0
            for r in range(repeats):
                local_s.append(_epoch(on_disk, workers, seed + 1 + r, want))
                hit_s.append(_epoch(cached, workers, seed + 1 + r, want))
                cache_misses += LAST_STATS["cache_misses"]
            report["hits_vs_local"] = {
                "fill_epoch_img_s": images / fill_s,
                "local_img_s": images / statistics.median(local_s),
                "cached_img_s": images / statistics.median(hit_s),
                "cached_gets": _gets(proxy),
                "cached_cache_misses": cache_misses,
                "ratio": statistics.median(local_s) / statistics.median(hit_s),
                "entries_after_fill": filled["entries"],
                "local_epochs_s": local_s,
                "cached_epochs_s": hit_s,
            }
            entry_bytes = describe_cache(str(Path(tmp) / "full"))["bytes"]

            # 2. half budget, fill
            half = CacheConfig(str(Path(tmp) / "half"), max_bytes=entry_bytes // 2)
            halved = s3_folder(proxy, half)
            _filled(halved, workers, seed, want)
            half_filled = describe_cache(half.directory)
            _reset_when_quiet(proxy)
            _epoch(halved, workers, seed + 1, want)
            gets = _gets(proxy)
            half_stats = dict(LAST_STATS)
            report["half_budget"] = {
                "budget_bytes": entry_bytes // 2,
                "entry_bytes": entry_bytes,
                "epoch2_gets": gets,
                "epoch2_get_share": gets / images,
                # the GETs the cache sent for its misses; the proxy's count adds hedges
                "epoch2_cache_misses": half_stats["cache_misses"],
                "epoch2_hedges": half_stats["hedges"],
                "entries_after_fill": half_filled["entries"],
                "bytes_after_fill": half_filled["bytes"],
                "ledger_bytes_after_fill": half_filled["ledger_bytes"],
            }

        # 3. a bandwidth cap on the storage link
        report["bandwidth_cap"] = {}
        for mbit in bandwidth_mbit:
            with ProxyProcess(server.endpoint_url, total_bandwidth=mbit * 1e6 / 8) as proxy:
                uncached_s = _epoch(s3_folder(proxy, None), workers, seed, want)
                capped_dir = str(Path(tmp) / f"capped-{mbit:g}")
                capped = s3_folder(proxy, capped_dir)
                _filled(capped, workers, seed, want)
                capped_entries = describe_cache(capped_dir)["entries"]
                _reset_when_quiet(proxy)
                capped_epochs, capped_misses = [], 0
                # what the storage side spends while the cached epochs run (it should idle)
                storage_cpu = server.cpu_seconds() + proxy.cpu_seconds()
                for r in range(repeats):
                    capped_epochs.append(_epoch(capped, workers, seed + 1 + r, want))
                    capped_misses += LAST_STATS["cache_misses"]
                storage_cpu = server.cpu_seconds() + proxy.cpu_seconds() - storage_cpu
                capped_s = statistics.median(capped_epochs)
                report["bandwidth_cap"][f"{mbit:g}"] = {
                    "uncached_img_s": images / uncached_s,
                    "cached_epoch2_img_s": images / capped_s,
                    "cached_epoch2_gets": _gets(proxy),
                    "cached_epoch2_cache_misses": capped_misses,
                    "cached_epochs_s": capped_epochs,
                    "cached_epochs_storage_cpu_s": storage_cpu,
                    "entries_after_fill": capped_entries,
                    "ratio": uncached_s / capped_s,
                }
    return report


def format_report(report: dict[str, Any]) -> str:
    hits, half = report["hits_vs_local"], report["half_budget"]
    caps = [
        f"bandwidth cap {mbit} Mbit/s: uncached {cap['uncached_img_s']:.0f} img/s, cached "
        f"epoch 2 {cap['cached_epoch2_img_s']:.0f} img/s ({cap['cached_epoch2_gets']} GETs, "
        f"storage CPU {cap['cached_epochs_storage_cpu_s']:.2f} s), ratio {cap['ratio']:.2f}x"
        for mbit, cap in report["bandwidth_cap"].items()
    ]
    return "\n".join(
        [
            f"{report['images']} images ({report['dataset_mb']:.0f} MB), "
            f"{report['workers']} workers, medians of {report['repeats']}",
            f"hits vs local disk: cached epoch 2 {hits['cached_img_s']:.0f} img/s "
            f"({hits['cached_gets']} GETs), local {hits['local_img_s']:.0f} img/s, "
            f"ratio {hits['ratio']:.3f}x (fill epoch {hits['fill_epoch_img_s']:.0f} img/s)",
            f"half budget (fill): epoch 2 sent {half['epoch2_gets']} GETs = "
            f"{half['epoch2_get_share']:.1%} of the images",
            *caps,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--bandwidth-mbit", default="200", help="caps of the storage link, comma separated"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=None, help="dataset cache")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for tests")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # the cache says at INFO when it fetches an object again because its entry was bad
    logging.getLogger("concurrent_loader.cache").setLevel(logging.INFO)
    report = run(
        images=args.images,
        workers=args.workers,
        repeats=args.repeats,
        bandwidth_mbit=[float(v) for v in args.bandwidth_mbit.split(",")],
        seed=args.seed,
        data_dir=args.data_dir,
        smoke=args.smoke,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
