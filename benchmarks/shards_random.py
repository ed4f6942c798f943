"""Random access over tar shards: S3 at +50 ms against the same shards on local disk.

``python -m benchmarks.shards_random`` generates the benchmark JPEGs (:mod:`benchmarks.data`,
cached under ``--data-dir``), packs them with ``concurrent_loader``'s packer
(``--image-folder``: an image and a ``.cls`` member per sample) into shards of
``--shard-size``, uploads the shards and their indexes to a local S3 server, and reads one
shuffled epoch of :class:`~concurrent_loader.ShardDataset` (decode: JPEG -> uint8 CHW at
``--image-size``) through :class:`~concurrent_loader.ConcurrentDataLoader` in each run:

- ``ours-local``: the shard files on local disk;
- ``ours-s3``: S3 through a proxy adding ``--latency-ms`` to every GET, one GET per sample;
- ``ours-s3 readahead=SPAN/MAX`` (``--readahead``, by default 8MiB/512MiB): samples cut
  from aligned spans of SPAN bytes kept in memory up to MAX per process
  (:class:`~concurrent_loader.Readahead`): in random order, one GET per span while MAX
  holds the spans in use, then one GET per sample for the overflow;
- with ``--objects``, ``objects-local`` and ``objects-s3``: the same JPEGs one object each
  (:class:`~concurrent_loader.ImageFolder`), for the per-object path's ratio in this run.

As the main benchmark does, the S3 server and the proxy run on ``--storage-cpus`` and the
loader (this process and its workers) on ``--client-cpus``, with ``--workers`` 1, and
images/s is the steady state after ``--warmup`` batches (to the end of the epoch). Runs
alternate (local, s3, ... then again, ``--repeats`` times) so that both see the same
machine load; the report gives each run's median images/s, its ratio to ``ours-local``
(medians of this run), the GETs per sample the proxy counted and the bytes it sent per
byte of sample data (both from the last repeat). Every run checks that each batch holds
the sampler's samples, in order, with the label of the sample's class folder (the
benchmark fails otherwise).

``--smoke`` runs a tiny version for tests: it proves the harness works and its figures are
finite, nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
BUCKET = "shards-random"
PREFIX = "shards/"


class KeyedImage:
    """``decode=``: (image, label, sample key), so a run can check every sample's identity."""

    def __init__(self, image_size: int) -> None:
        from concurrent_loader import ImageSample

        self.image = ImageSample(image_size)

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int, str]:
        image, label = self.image(sample)
        return image, label, sample["__key__"]


def _readahead(text: str) -> Any:
    from concurrent_loader import Readahead
    from concurrent_loader.shards.pack import parse_size

    span, _, most = text.partition("/")
    return Readahead(span_bytes=parse_size(span), max_bytes=parse_size(most))


def _labels_and_keys(ds: Any) -> tuple[list[int], list[str] | None]:
    """Each sample's label and, for shards, its key: what every batch is checked against."""
    if hasattr(ds, "shards"):
        keys = list(ds.source.sample_keys)
        classes = sorted({key.split("/", 1)[0] for key in keys})
        return [classes.index(key.split("/", 1)[0]) for key in keys], keys
    return ds.targets.tolist(), None  # an ImageFolder


def _epoch(ds: Any, *, batch_size: int, workers: int, seed: int, warmup: int) -> dict[str, float]:
    """One shuffled epoch; checks every sample; returns images/s after ``warmup`` batches
    (the steady state: worker start-up and the first GETs left out) and the epoch's time."""
    import torch

    from concurrent_loader import ConcurrentDataLoader

    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed)).tolist()
    loader = ConcurrentDataLoader(ds, batch_size=batch_size, sampler=order, num_workers=workers)
    labels_of, keys_of = _labels_and_keys(ds)
    started = time.perf_counter()
    warm_at, warm_seen, seen = started, 0, 0
    for b, batch in enumerate(loader):
        indices = order[b * batch_size : (b + 1) * batch_size]
        images, labels = batch[0], batch[1]
        if keys_of is not None and list(batch[2]) != [keys_of[i] for i in indices]:
            raise AssertionError(f"batch {b} does not hold the sampler's samples in order")
        if labels.tolist() != [labels_of[i] for i in indices]:
            raise AssertionError(f"batch {b} has a wrong label")
        if images.shape[0] != len(indices):
            raise AssertionError(f"batch {b} has {images.shape[0]} images for {len(indices)}")
        seen += len(indices)
        if b + 1 == warmup:
            warm_at, warm_seen = time.perf_counter(), seen
    ended = time.perf_counter()
    if seen != len(ds):
        raise AssertionError(f"{seen} samples for a dataset of {len(ds)}")
    return {"epoch_s": ended - started, "images_per_s": (seen - warm_seen) / (ended - warm_at)}


def run(
    *,
    images: int = 2000,
    shard_size: str = "64MB",
    workers: int = 1,
    batch_size: int = 64,
    image_size: int = 224,
    latency_ms: float = 50.0,
    readaheads: Sequence[str] = ("8MiB/512MiB",),
    objects: bool = False,
    repeats: int = 3,
    seed: int = 0,
    warmup: int = 2,
    storage_cpus: Sequence[int] | None = (1,),
    client_cpus: Sequence[int] | None = (0,),
    data_dir: Path = REPO_ROOT / ".bench/data",
    smoke: bool = False,
) -> dict[str, Any]:
    """Every run's figures (see the module)."""
    from benchmarks.data import DatasetSpec, ensure_local
    from concurrent_loader import ImageFolder, ShardDataset
    from concurrent_loader.shards.pack import pack, parse_size
    from concurrent_loader.stores import S3Config
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    if smoke:
        images, shard_size, batch_size, image_size, repeats = 96, "1MB", 16, 32, 1
        workers = min(workers, 1)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if len(cpus) < 2 or not storage_cpus or not client_cpus:
        storage_cpus = client_cpus = None  # one CPU: nothing to split
    local, _ = ensure_local(DatasetSpec(images=images), data_dir)
    decode = KeyedImage(image_size)
    runs: dict[str, list[dict[str, float]]] = {}
    traffic: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="shards-bench-") as tmp:
        shards_dir = Path(tmp) / "shards"
        packed = pack(
            str(local.train_dir),
            str(shards_dir),
            shard_size=parse_size(shard_size),
            image_folder=True,
        )
        storage = set(storage_cpus) if storage_cpus else None
        try:
            with (
                LocalS3Server(cpus=storage) as server,
                ProxyProcess(server.endpoint_url, latency_ms=latency_ms, cpus=storage) as proxy,
            ):
                if client_cpus:
                    # The loader (this process and its workers) apart from the server and proxy,
                    # as the main benchmark runs it: local disk has no server to pay for. Given
                    # back at the end (a test may run this in its own process).
                    os.sched_setaffinity(0, set(client_cpus))
                server.create_bucket(BUCKET)
                server.upload_dir(shards_dir, BUCKET, prefix=PREFIX)
                credentials = {
                    "endpoint_url": proxy.endpoint_url,
                    "region": server.region,
                    "aws_access_key_id": server.access_key,
                    "aws_secret_access_key": server.secret_key,
                }
                datasets = {"ours-local": ShardDataset(shards_dir, decode=decode)}
                s3_root = S3Config.from_url(f"s3://{BUCKET}/{PREFIX}", **credentials)
                datasets["ours-s3"] = ShardDataset(s3_root, decode=decode)
                for readahead in readaheads:
                    datasets[f"ours-s3 readahead={readahead}"] = ShardDataset(
                        s3_root, decode=decode, readahead=_readahead(readahead)
                    )
                if objects:
                    # The same JPEGs one object each (ImageFolder): the per-object path's
                    # S3-vs-local ratio under the same machine load, for reference.
                    server.upload_dir(local.train_dir, BUCKET, prefix="objects/")
                    datasets["objects-local"] = ImageFolder(local.train_dir, image_size=image_size)
                    datasets["objects-s3"] = ImageFolder(
                        s3_root.with_root(f"s3://{BUCKET}/objects/"), image_size=image_size
                    )
                s3 = datasets["ours-s3"].source
                # What the samples' reads ask for (their members and the headers between them).
                sample_bytes = sum(s3.reads(i)[0].size or 0 for i in range(len(s3)))
                for repeat in range(repeats):
                    for name, ds in datasets.items():
                        proxy.reset_stats()
                        figures = _epoch(
                            ds,
                            batch_size=batch_size,
                            workers=workers,
                            seed=seed + repeat,
                            warmup=warmup,
                        )
                        runs.setdefault(name, []).append(figures)
                        if name.startswith("ours-s3"):
                            stats = proxy.stats()
                            traffic[name] = {
                                "gets_per_sample": stats["requests_by_method"].get("GET", 0)
                                / len(ds),
                                "bytes_sent_per_sample_byte": stats["bytes_sent"] / sample_bytes,
                            }
                for ds in datasets.values():
                    ds.close()
        finally:
            if client_cpus:
                os.sched_setaffinity(0, cpus)
    medians = {
        name: statistics.median(r["images_per_s"] for r in results)
        for name, results in runs.items()
    }
    return {
        "images": images,
        "shards": len(packed.shards),
        "shard_size": shard_size,
        "shard_bytes": packed.bytes,
        "workers": workers,
        "batch_size": batch_size,
        "image_size": image_size,
        "latency_ms": latency_ms,
        "repeats": repeats,
        "warmup_batches": warmup,
        "storage_cpus": sorted(storage_cpus) if storage_cpus else None,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "runs": {
            name: {
                "images_per_s": medians[name],
                "images_per_s_all": [r["images_per_s"] for r in runs[name]],
                "epoch_s": statistics.median(r["epoch_s"] for r in runs[name]),
                "x_local": medians[name] / medians["ours-local"],
                **traffic.get(name, {}),
            }
            for name in runs
        },
    }


def format_report(report: dict[str, Any]) -> str:
    head = (
        f"{report['images']} JPEGs in {report['shards']} shards of <= {report['shard_size']} "
        f"({report['shard_bytes'] / 1e6:.0f} MB), {report['workers']} workers, batch "
        f"{report['batch_size']}, decode to {report['image_size']} px, S3 at "
        f"+{report['latency_ms']:g} ms, median of {report['repeats']} epochs, images/s after "
        f"{report['warmup_batches']} warm-up batches; server+proxy on CPUs "
        f"{report['storage_cpus']}, loader on CPUs {report['client_cpus']}"
    )
    lines = [
        head,
        "| run | img/s median (all) | x ours-local | whole epoch s (median) | GETs per sample "
        "| bytes sent / sample byte |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in report["runs"].items():
        every = ", ".join(f"{v:.0f}" for v in r["images_per_s_all"])
        gets = f"{r['gets_per_sample']:.3f}" if "gets_per_sample" in r else "-"
        sent = f"{r['bytes_sent_per_sample_byte']:.2f}" if "gets_per_sample" in r else "-"
        lines.append(
            f"| {name} | {r['images_per_s']:.1f} ({every}) | {r['x_local']:.2f} "
            f"| {r['epoch_s']:.2f} | {gets} | {sent} |"
        )
    runs = report["runs"]
    if "objects-s3" in runs:
        ratio = runs["objects-s3"]["images_per_s"] / runs["objects-local"]["images_per_s"]
        lines.append(f"objects-s3 / objects-local: {ratio:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.shards_random",
        description="Random access over tar shards: S3 with latency vs local disk.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--shard-size", default="64MB")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument(
        "--readahead",
        default="8MiB/512MiB",
        help="read-ahead rows, comma-separated SPAN/MAX (8MiB/512MiB): spans kept in memory",
    )
    parser.add_argument(
        "--objects",
        action="store_true",
        help="also read the same JPEGs one object each (ImageFolder), local and S3, for reference",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2, help="batches before the timed part")
    parser.add_argument("--storage-cpus", default="1", help="CPUs of the server and proxy")
    parser.add_argument("--client-cpus", default="0", help="CPUs of the loader ('' for all)")
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".bench/data")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, for tests")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    report = run(
        images=args.images,
        shard_size=args.shard_size,
        workers=args.workers,
        batch_size=args.batch_size,
        image_size=args.image_size,
        latency_ms=args.latency_ms,
        readaheads=[r for r in args.readahead.split(",") if r],
        objects=args.objects,
        repeats=args.repeats,
        seed=args.seed,
        warmup=args.warmup,
        storage_cpus=[int(c) for c in args.storage_cpus.split(",") if c],
        client_cpus=[int(c) for c in args.client_cpus.split(",") if c],
        data_dir=args.data_dir,
        smoke=args.smoke,
    )
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
