"""Pre-sized shards streamed from S3: images packed at full size against the same images
packed pre-sized (a JPEG, and raw pixels, at shorter side ``--short-side``), and ours
against the ``webdataset`` library reading the same pre-sized shards.

    flock /tmp/bench.lock python -m benchmarks.shards_presize [--smoke] [--images 2000] ...

Setup: the generated ImageNet-like JPEGs (:mod:`benchmarks.data`, 500x375, about 110 KB)
packed three times with the project's own command, each into shards of ``--shard-mib``::

    concurrent-loader pack SRC DEST --image-folder [--resize S [--format raw]]

(members ``c/x.jpg`` or ``c/x.raw`` and ``c/x.cls``, with their ``.idx``), uploaded to the
local S3 server behind a +``--latency-ms`` proxy; server and proxy pinned to the storage
CPUs, this process (and so its loader workers) to the client CPUs. Every row makes the
same sample with the same decoder, torchvision's ``Resize(--resize-size)`` then
``CenterCrop(--image-size)`` (:class:`~concurrent_loader.decode.ImageDecoder` with
``resize_size``: for an image stored at that size, a decode and a crop, or for the raw form
a crop alone), with ``--workers`` workers, batch ``--batch-size`` and a shuffle buffer of
``--buffer`` samples:

- ``ours-<form>``: ``ShardDataset(s3://.../<form>/, decode=ImageSample(224,
  resize_size=256), readahead=Readahead())`` with ``ShardOrderSampler`` (told the workers by
  the loader: each worker streams shards of its own in aligned 8 MiB spans) and
  ``ConcurrentDataLoader``; ``<form>`` is ``full``, ``jpegS`` or ``rawS``;
- ``webdataset-<form>``: the ``webdataset`` library and a stock ``DataLoader`` over the same
  shards, each streamed with ``curl`` from a presigned URL, as in
  :mod:`benchmarks.shards_peers`.

Each round runs every row for ``--epochs`` epochs in a row (workers started each epoch,
counted), the rows in the opposite order in the next round, so a load on the shared
machine hits them alike; a row's figure is its median round. Images/s are whole epochs
(from ``iter(loader)`` to the last batch); every epoch is checked to yield every sample
once. Targets: ``ours-jpegS`` and
``ours-rawS`` >= 3x ``ours-full``, and each ahead of ``webdataset`` on the same shards.
Bytes per sample: each form's shards (``.tar`` and ``.idx``) over the images.

``--smoke`` runs it tiny (the test suite does); its figures mean nothing.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPO_ROOT))

MiB = 1024 * 1024
#: the targets: images/s of a pre-sized form against full-size shards (ours), at least
TARGET_AGAINST_FULL = 3.0
SMOKE = {
    "images": 96,
    "classes": 4,
    "batch_size": 16,
    "image_size": 64,
    "resize_size": 72,
    "short_side": 72,
    "shard_mib": 1,
    "buffer": 32,
    "latency_ms": 5.0,
    "rounds": 1,
    "epochs": 1,
}


def forms(short_side: int) -> dict[str, list[str]]:
    """Each form's name and the ``pack`` options that make it."""
    resize = ["--resize", str(short_side)]
    return {
        "full": [],
        f"jpeg{short_side}": resize,
        f"raw{short_side}": [*resize, "--format", "raw"],
    }


def rows(short_side: int) -> list[tuple[str, str]]:
    """(loader, form) of every row, in run order."""
    presized = list(forms(short_side))[1:]
    return [("ours", "full"), *(("ours", f) for f in presized)] + [
        ("webdataset", f) for f in presized
    ]


# ---------------------------------------------------------------------------- loaders


def _decoder(args: argparse.Namespace) -> Any:
    from concurrent_loader.decode import ImageDecoder

    return ImageDecoder(args.image_size, resize_size=args.resize_size)


def build_ours(args: argparse.Namespace, endpoint_url: str, form: str) -> Any:
    from benchmarks.shards_peers import BUCKET
    from concurrent_loader import ConcurrentDataLoader, FetchConfig, Readahead, ShardDataset
    from concurrent_loader.shards.dataset import ImageSample
    from concurrent_loader.stores import S3Config
    from concurrent_loader.streaming import ShardOrderSampler

    dataset = ShardDataset(
        S3Config.from_url(f"s3://{BUCKET}/presize/{form}/", endpoint_url=endpoint_url),
        decode=ImageSample(args.image_size, resize_size=args.resize_size),
        readahead=Readahead(max_bytes=readahead_bytes(args, form)),
        fetch_config=FetchConfig(max_inflight_requests=64),
    )
    sampler = ShardOrderSampler(dataset.shard_lengths, buffer_size=args.buffer, seed=0)
    return ConcurrentDataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers
    )


def readahead_bytes(args: argparse.Namespace, form: str) -> int:
    """``--readahead-mib``, or ``Readahead``'s own rule: a shuffle buffer's samples plus two
    spans (the default, 128 MiB, is too small for 512 raw samples of 262 KB)."""
    from concurrent_loader import Readahead

    if args.readahead_mib:
        return int(args.readahead_mib * MiB)
    default = Readahead()
    window = args.buffer * args.sample_bytes[form] + 2 * default.span_bytes
    return max(default.max_bytes, int(window))


def build_webdataset(args: argparse.Namespace, endpoint_url: str, form: str) -> Any:
    """``benchmarks.shards_peers``' webdataset row over this form's shards: the image member
    is ``.jpg`` or ``.raw``, decoded by the same decoder as ours."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    from benchmarks.shards_peers import _presigned

    endpoint = argparse.Namespace(endpoint_url=endpoint_url)
    urls = [_presigned(endpoint, f"presize/{form}/{s}") for s in args.shards[form]]  # type: ignore[arg-type]
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=None, empty_check=False)
        .shuffle(args.buffer)
        .to_tuple("jpg;raw", "cls")
        .map_tuple(_decoder(args), lambda b: int(b))
    )
    return DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)


BUILDERS = {"ours": build_ours, "webdataset": build_webdataset}


# ---------------------------------------------------------------------------- measuring


def run_row(
    args: argparse.Namespace,
    endpoint_url: str,
    loader_name: str,
    form: str,
    storage_cpu: Any = lambda: 0.0,
    proxy_stats: Any = lambda: {},
) -> Any:
    """``--epochs`` epochs of one row: whole-epoch images/s, the first batch's seconds, the
    CPU the client side (this process tree less the storage) and the storage side (server
    and proxy: ``storage_cpu()``, seconds so far) used per second of the epochs, and the
    GETs and bytes the proxy sent per sample (``proxy_stats()``, its counters so far)."""
    import torch

    from benchmarks.measure import process_tree_usage

    loader = BUILDERS[loader_name](args, endpoint_url, form)
    cpu_before, storage_before, proxy_before = process_tree_usage()[0], storage_cpu(), proxy_stats()
    expected = sorted(i % args.classes for i in range(args.images))
    images = 0
    seconds = 0.0
    first = []
    for _ in range(args.epochs):
        started = time.perf_counter()
        labels = []
        arrived = None
        for batch_images, batch_labels in loader:
            arrived = arrived or time.perf_counter()
            if tuple(batch_images.shape[1:]) != (3, args.image_size, args.image_size):
                raise RuntimeError(f"{loader_name}-{form}: a batch of {batch_images.shape}")
            labels.append(torch.as_tensor(batch_labels))
        seconds += time.perf_counter() - started
        if sorted(torch.cat(labels).tolist()) != expected:
            raise AssertionError(f"{loader_name}-{form} did not yield every sample once")
        images += args.images
        first.append((arrived or started) - started)
    storage = storage_cpu() - storage_before
    client = process_tree_usage()[0] - cpu_before - storage
    proxy_after = proxy_stats()

    def per_sample(counter: Any) -> float:
        return (counter(proxy_after) - counter(proxy_before)) / images if proxy_after else 0.0

    del loader
    return {
        "images_per_s": images / seconds,
        "first_batch_s": statistics.median(first),
        "client_cpu_share": client / seconds,
        "storage_cpu_share": storage / seconds,
        "gets_per_sample": per_sample(lambda s: s["requests_by_method"].get("GET", 0)),
        "proxy_bytes_per_sample": per_sample(lambda s: s["bytes_sent"]),
    }


def _pack(args: argparse.Namespace, src: Path, work: Path, s3: Any, bucket: str) -> dict[str, Any]:
    """Every form packed (``concurrent-loader pack``) and uploaded: its shards and bytes."""
    packed: dict[str, Any] = {}
    for form, options in forms(args.short_side).items():
        dest = work / form
        options = ["--image-folder", "--shard-size", f"{args.shard_mib}MiB", *options]
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "concurrent_loader", "pack", str(src), str(dest), *options],
            check=True,
            capture_output=True,
        )
        files = sorted(dest.iterdir())
        s3.upload_dir(dest, bucket, prefix=f"presize/{form}/")
        packed[form] = {
            "command": " ".join(["concurrent-loader pack SRC DEST", *options]),
            "pack_s": time.perf_counter() - started,
            "shards": [f.name for f in files if f.suffix == ".tar"],
            "bytes_per_sample": sum(f.stat().st_size for f in files) / args.images,
        }
        print(f"packed {form}: {len(packed[form]['shards'])} shards", flush=True)
    return packed


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.data import DatasetSpec, ensure_local
    from benchmarks.measure import pin_to
    from benchmarks.shards_peers import BUCKET
    from concurrent_loader.testing import LocalS3Server, ProxyProcess
    from concurrent_loader.testing.subprocesses import process_cpu_seconds

    spec = DatasetSpec(images=args.images, classes=args.classes, seed=0)
    local, _ = ensure_local(spec, args.data_dir)
    storage = set(args.storage_cpus)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="shards-presize-")))
        s3 = stack.enter_context(LocalS3Server(cpus=storage))
        s3.create_bucket(BUCKET)
        os.environ.update(s3.env())
        packed = _pack(args, local.train_dir, work, s3, BUCKET)
        args.shards = {form: p["shards"] for form, p in packed.items()}
        args.sample_bytes = {form: p["bytes_per_sample"] for form, p in packed.items()}
        proxy = stack.enter_context(
            ProxyProcess(s3.endpoint_url, latency_ms=args.latency_ms, cpus=storage)
        )
        affinity = pin_to(args.client_cpus)
        results: dict[str, list[dict[str, Any]]] = {
            f"{n}-{f}": [] for n, f in rows(args.short_side)
        }
        for round_ in range(args.rounds):
            # Reversed in odd rounds: a drift in the machine's load hits every row alike.
            order = rows(args.short_side)
            for name, form in order if round_ % 2 == 0 else reversed(order):
                figures = run_row(
                    args,
                    proxy.endpoint_url,
                    name,
                    form,
                    lambda: proxy.cpu_seconds() + process_cpu_seconds(s3.pid),
                    proxy.stats,
                )
                results[f"{name}-{form}"].append(figures)
                print(f"{name}-{form}: {figures['images_per_s']:.0f} img/s", flush=True)
    report: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items() if k != "shards"},
        "client_affinity": affinity,
        "forms": packed,
        "rows": {},
    }
    for row, figures in results.items():
        rates = [f["images_per_s"] for f in figures]
        median = statistics.median(rates)
        form = row.split("-", 1)[1]
        report["rows"][row] = {
            "images_per_s": median,
            "images_per_s_rounds": rates,
            "first_batch_s": statistics.median(f["first_batch_s"] for f in figures),
            # the shards' bytes each second (a sample's share of its shard, index included)
            "mb_per_s": median * packed[form]["bytes_per_sample"] / 1e6,
            "client_cpu_share": statistics.median(f["client_cpu_share"] for f in figures),
            "storage_cpu_share": statistics.median(f["storage_cpu_share"] for f in figures),
            "gets_per_sample": statistics.median(f["gets_per_sample"] for f in figures),
            "proxy_bytes_per_sample": statistics.median(
                f["proxy_bytes_per_sample"] for f in figures
            ),
        }
    report["ratios"] = _ratios(report["rows"], args.short_side)
    return report


def _ratios(by_row: dict[str, Any], short_side: int) -> list[dict[str, Any]]:
    out = []
    for form in list(forms(short_side))[1:]:
        mine = by_row[f"ours-{form}"]["images_per_s"]
        for against, target in (("ours-full", TARGET_AGAINST_FULL), (f"webdataset-{form}", 1.0)):
            ratio = mine / by_row[against]["images_per_s"]
            out.append(
                {
                    "row": f"ours-{form}",
                    "against": against,
                    "ratio": ratio,
                    "target": target,
                    "met": ratio >= target if against == "ours-full" else ratio > target,
                }
            )
    return out


def format_report(report: dict[str, Any]) -> str:
    a = report["args"]
    lines = [
        f"{a['images']} images, {a['workers']} workers on CPUs {report['client_affinity']}, "
        f"server and proxy on CPUs {a['storage_cpus']}, batch {a['batch_size']}, "
        f"Resize({a['resize_size']}) + CenterCrop({a['image_size']}), S3 at "
        f"+{a['latency_ms']:g} ms, {a['epochs']} epochs per run, {a['rounds']} rounds",
        "",
        "| row | img/s, whole epochs: median (rounds) | first batch, s | MB/s | client CPU "
        "(cores) | server + proxy CPU (cores) | GETs per sample | proxy bytes per sample |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, r in report["rows"].items():
        rounds = ", ".join(f"{v:.0f}" for v in r["images_per_s_rounds"])
        lines.append(
            f"| {row} | {r['images_per_s']:.0f} ({rounds}) | {r['first_batch_s']:.2f} "
            f"| {r['mb_per_s']:.0f} | {r['client_cpu_share']:.2f} "
            f"| {r['storage_cpu_share']:.2f} | {r['gets_per_sample']:.3f} "
            f"| {r['proxy_bytes_per_sample']:.0f} |"
        )
    lines += ["", "| row | against | ratio | target |", "|---|---|---|---|"]
    for c in report["ratios"]:
        goal = f">= {c['target']:g}x" if c["against"] == "ours-full" else "> 1x"
        met = "met" if c["met"] else "missed"
        lines.append(f"| {c['row']} | {c['against']} | {c['ratio']:.2f}x | {goal}: {met} |")
    lines += ["", "| form | disk bytes per sample | shards | pack command |", "|---|---|---|---|"]
    for form, p in report["forms"].items():
        lines.append(
            f"| {form} | {p['bytes_per_sample']:.0f} | {len(p['shards'])} | `{p['command']}` |"
        )
    return "\n".join(lines)


def _cpus(text: str) -> list[int]:
    return [int(c) for c in text.split(",") if c.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.shards_presize", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224, help="CenterCrop's size")
    p.add_argument("--resize-size", type=int, default=256, help="Resize's shorter side")
    p.add_argument("--short-side", type=int, default=256, help="the pre-sized shorter side")
    p.add_argument("--shard-mib", type=int, default=16, help="shard size (MiB)")
    p.add_argument("--buffer", type=int, default=512, help="shuffle buffer (samples)")
    p.add_argument(
        "--readahead-mib",
        type=int,
        default=0,
        help="ours: Readahead.max_bytes (0: the shuffle buffer's bytes + 2 spans)",
    )
    p.add_argument("--latency-ms", type=float, default=50.0, help="first-byte delay per GET")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved runs per row")
    p.add_argument("--client-cpus", type=_cpus, default=[0])
    p.add_argument("--storage-cpus", type=_cpus, default=[1])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".bench/data")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--smoke", action="store_true", help="tiny CI run: " + json.dumps(SMOKE))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    available = sorted(os.sched_getaffinity(0))
    # A machine with one CPU cannot separate the two sides: share it.
    args.client_cpus = [c for c in args.client_cpus if c in available] or available[:1]
    args.storage_cpus = [c for c in args.storage_cpus if c in available] or available[-1:]
    report = measure(args)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
