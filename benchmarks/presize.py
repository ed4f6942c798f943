"""Pre-sized samples: epochs read from a cache that keeps each image pre-sized, against a
stock ``DataLoader`` and against our loader over the original JPEGs on local disk.

Every configuration makes the standard ImageNet evaluation sample, torchvision's
``Resize(256)`` then ``CenterCrop(224)`` (``--resize-size``, ``--image-size``): one worker
on one core, batch 64, shuffled with a seeded generator. Four configurations, each run in a
fresh subprocess pinned to the client CPUs (its worker inherits the pinning); ``S`` is
``--short-side``, the pre-sized forms' shorter side (256):

- ``stock``: ``torch.utils.data.DataLoader`` over a plain map-style dataset
  (:class:`PilFolder`) that opens each original JPEG from local disk with PIL (no draft
  mode) and does what ``Resize(256)`` + ``CenterCrop(224)`` do to a PIL image (the shorter
  side to 256, bilinear; the centre 224x224), as a torchvision user writes it;
- ``local``: ``ConcurrentDataLoader`` over ``ImageFolder(<local dir>, image_size=224,
  resize_size=256)``, the original JPEGs on local disk;
- ``jpegS``: ``ConcurrentDataLoader`` over ``ImageFolder(s3://..., image_size=224,
  resize_size=256, cache=CacheConfig(dir, presize=Presize(S)))``, S3 through the +50 ms
  latency proxy: with S = 256, a decode and a crop, no resample;
- ``rawS``: the same with ``Presize(S, format="raw")``: a crop only;
- ``jpegS-pillow`` (with ``--pillow-row``): ``jpegS`` with ``simplejpeg`` hidden from the
  run (``sys.modules``), so every JPEG is decoded by Pillow: what the optional decoder
  gains, within one run.

Setup as in the other benchmarks: the generated ImageNet-like JPEGs (:mod:`benchmarks.data`,
500x375, about 110 KB), the local S3 server and the latency proxy pinned to the storage
CPUs. Before any timed run, one epoch of each cached configuration fills its cache (its
figures are the ``fill`` rows) and one epoch of ``local`` warms the page cache. The timed
runs are later epochs: every read of the cached configurations is a hit (the proxy's GETs
over the timed runs are reported; the target is 0). Each repeat runs the four
configurations once, in the opposite order in the next repeat.

What each run reports, over its ``--epochs`` epochs:

- ``whole``: images over seconds from ``iter(loader)`` to each epoch's last batch, epoch
  starts included (worker start, first batch), as :mod:`benchmarks.epochs` times them;
- ``steady``: the steady-state window of :mod:`benchmarks.measure` in each epoch: after a
  warm-up of every batch the loader can hold ahead plus one, to the epoch's last batch.

Each row gives the median and the range over ``--repeats`` runs; the ratios (medians
against medians, and per repeat) are against ``stock`` (targets: ``jpegS`` >= 3x,
``rawS`` >= 8x) and against ``local``. Bytes per sample: the original JPEGs' mean size
on disk, and each cache's entry bytes over its entries. The command (about 5 minutes on 2
cores)::

    flock /tmp/bench.lock python -m benchmarks.presize --images 1000 --epochs 3 --repeats 3

``--smoke`` runs a tiny version (the test suite does); its figures mean nothing.
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
#: the Presize formats of the cached configurations, named ``<format><short side>``
FORMATS = ("jpeg", "raw")
#: the targets: images/s against the stock loader's, at least, per format
TARGETS = {"jpeg": 3.0, "raw": 8.0}


def cached_configs(short_side: int) -> dict[str, str]:
    """The cached configurations of pre-sized forms at ``short_side`` and their format."""
    return {f"{fmt}{short_side}": fmt for fmt in FORMATS}


#: the suffix of a cached configuration decoded by Pillow alone
PILLOW = "-pillow"


def configs(short_side: int, pillow_row: bool = False) -> tuple[str, ...]:
    """The configurations, in the order of an even repeat (an odd one runs them reversed)."""
    extra = (f"jpeg{short_side}{PILLOW}",) if pillow_row else ()
    return ("stock", "local", *cached_configs(short_side), *extra)


def title(config: str, short_side: int) -> str:
    """The row label of ``config``."""
    if config == "stock":
        return "DataLoader + PIL, original JPEGs (local disk)"
    if config == "local":
        return "ConcurrentDataLoader, original JPEGs (local disk)"
    if cached_configs(short_side)[config.removesuffix(PILLOW)] == "raw":
        return f'ConcurrentDataLoader, S3 + cache of Presize({short_side}, format="raw")'
    pillow = ", decoded by Pillow alone" if config.endswith(PILLOW) else ""
    return f"ConcurrentDataLoader, S3 + cache of Presize({short_side}) JPEGs{pillow}"


#: the configurations at the default short side
CONFIGS = configs(256)

SMOKE = {
    "images": 64,
    "classes": 4,
    "batch_size": 4,
    "epochs": 2,
    "repeats": 1,
    "latency_ms": 5.0,
    # Few enough in flight that the loader's read-ahead leaves a steady-state window in a
    # 16-batch epoch (self-tuned, it would hold the whole tiny epoch ahead).
    "max_inflight_requests": 8,
}


def _order(repeat: int, names: Sequence[str] = CONFIGS) -> list[str]:
    """The configurations of repeat ``repeat``: ``names``, reversed in odd repeats."""
    return list(names) if repeat % 2 == 0 else list(reversed(names))


# ---------------------------------------------------------------------------- one run


class PilFolder:
    """The stock baseline's dataset: item ``i`` opens the original JPEG with PIL (full
    decode, no draft mode), does torchvision's ``Resize(resize_size)`` (the shorter side to
    ``resize_size``, bilinear, the longer side truncated) and ``CenterCrop(image_size)``
    (offsets rounded) to it and returns ``(uint8 [3, S, S] tensor, label)``."""

    def __init__(self, train_dir: str, image_size: int, resize_size: int) -> None:
        self.image_size = image_size
        self.resize_size = resize_size
        classes = sorted(e.name for e in os.scandir(train_dir) if e.is_dir())
        self.samples = [
            (os.path.join(train_dir, cls, name), label)
            for label, cls in enumerate(classes)
            for name in sorted(os.listdir(os.path.join(train_dir, cls)))
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        import numpy as np
        import torch
        from PIL import Image

        path, label = self.samples[index]
        size, short = self.image_size, self.resize_size
        with Image.open(path) as img:
            rgb = img.convert("RGB")
        w, h = rgb.size
        new_w, new_h = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
        rgb = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
        left, top = round((new_w - size) / 2.0), round((new_h - size) / 2.0)
        rgb = rgb.crop((left, top, left + size, top + size))
        pixels = torch.from_numpy(np.array(rgb, dtype=np.uint8))
        return pixels.permute(2, 0, 1).contiguous(), label


def _loader(spec: dict[str, Any]) -> Any:
    import torch

    generator = torch.Generator().manual_seed(spec["seed"])
    common = {
        "batch_size": spec["batch_size"],
        "shuffle": True,
        "num_workers": spec["workers"],
        "generator": generator,
        "persistent_workers": spec["persistent"],
    }
    if spec["config"] == "stock":
        from torch.utils.data import DataLoader

        folder = PilFolder(spec["local_dir"], spec["image_size"], spec["resize_size"])
        return DataLoader(folder, **common)

    from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder

    # 0: the self-tuned default
    fetch_config = FetchConfig(max_inflight_requests=spec["max_inflight_requests"] or None)
    sizes = {"image_size": spec["image_size"], "resize_size": spec["resize_size"]}
    if spec["config"] == "local":
        dataset = ImageFolder(spec["local_dir"], **sizes, fetch_config=fetch_config)
    else:
        from concurrent_loader.cache import CacheConfig
        from concurrent_loader.decode import Presize

        form = cached_configs(spec["short_side"])[spec["config"].removesuffix(PILLOW)]
        presize = Presize(spec["short_side"], format=form)
        # The endpoint and credentials come from the environment (AWS_ENDPOINT_URL: the
        # latency proxy).
        dataset = ImageFolder(
            spec["s3_url"],
            **sizes,
            fetch_config=fetch_config,
            cache=CacheConfig(spec["cache_dir"], presize=presize),
        )
    return ConcurrentDataLoader(dataset, **common)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration's epochs, in this (pinned) process: what ``--run`` executes."""
    if spec["config"].endswith(PILLOW):
        sys.modules["simplejpeg"] = None  # type: ignore[assignment]  # import fails: Pillow
    from benchmarks.measure import _check_batch, buffered_batches, pin_to, process_tree_usage

    affinity = pin_to(spec["client_cpus"])
    loader = _loader(spec)
    size = len(loader.dataset)
    batches = len(loader)
    warmup = max(spec["warmup_batches"], buffered_batches(loader) + 1)
    epochs = []
    for epoch in range(spec["epochs"]):
        cpu = process_tree_usage()[0]
        started = time.perf_counter()
        arrivals: list[float] = []
        counts: list[int] = []
        for batch in loader:
            arrivals.append(time.perf_counter())
            counts.append(_check_batch(batch, spec["image_size"]))
        ended = arrivals[-1]
        cpu = process_tree_usage()[0] - cpu
        images = sum(counts)
        if images != size or len(counts) != batches:
            raise RuntimeError(f"an epoch gave {images} images of {size}")
        # The steady-state window: from the warm-up's last batch to the epoch's last.
        window = None
        if warmup < batches:
            window = {
                "images": sum(counts[warmup:]),
                "seconds": ended - arrivals[warmup - 1],
            }
        # The loader's counters cover its last epoch (None for the stock loader).
        stats = loader.stats() if hasattr(loader, "stats") else {}
        epochs.append(
            {
                "epoch": epoch,
                "cache_misses": stats.get("cache_misses"),
                "images": images,
                "seconds": ended - started,
                "images_per_s": images / (ended - started),
                "first_batch_s": arrivals[0] - started,
                "cpu_ms_per_image": cpu / images * 1000,
                "window": window,
            }
        )
    del loader
    misses = [e["cache_misses"] for e in epochs if e["cache_misses"] is not None]
    return {
        "epochs": epochs,
        "warmup_batches": warmup,
        "batches_per_epoch": batches,
        "cache_misses": sum(misses) if misses else None,
        "affinity": affinity,
    }


# ---------------------------------------------------------------------------- the driver


@contextlib.contextmanager
def _storage(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The dataset on disk and in the S3 server, behind the latency proxy."""
    from benchmarks.data import DatasetSpec, ensure_local, ensure_uploaded
    from concurrent_loader.testing import LocalS3Server, ProxyProcess

    spec = DatasetSpec(images=args.images, classes=min(args.classes, args.images), seed=args.seed)
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
                "proxy": proxy,
                "s3_url": f"s3://{bucket}/train/",
                "local_dir": str(local.train_dir.resolve()),
                "original_bytes_per_sample": local.mean_object_bytes,
            }


def _run_in_subprocess(spec: dict[str, Any], env: dict[str, str], timeout: float) -> Any:
    with tempfile.TemporaryDirectory(prefix="bench-presize-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.presize", "--run", str(spec_path), str(out_path)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not out_path.exists():
            tail = done.stderr.decode(errors="replace")[-3000:]
            raise RuntimeError(f"run {spec['config']} failed ({done.returncode}):\n{tail}")
        return json.loads(out_path.read_text())


def _rates(result: dict[str, Any]) -> tuple[float, float | None]:
    """(whole-epoch images/s, steady-state images/s) over one run's epochs."""
    epochs = result["epochs"]
    whole = sum(e["images"] for e in epochs) / sum(e["seconds"] for e in epochs)
    windows = [e["window"] for e in epochs if e["window"]]
    steady = None
    if windows:
        steady = sum(w["images"] for w in windows) / sum(w["seconds"] for w in windows)
    return whole, steady


def _summary(values: Sequence[float | None]) -> dict[str, Any] | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {
        "median": statistics.median(known),
        "min": min(known),
        "max": max(known),
        "values": list(values),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Fill the caches, then every configuration ``--repeats`` times: the report."""
    from benchmarks.cache import _reset_when_quiet
    from concurrent_loader.cache import describe_cache

    report: dict[str, Any] = {
        "images": args.images,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "resize_size": args.resize_size,
        "short_side": args.short_side,
        "latency_ms": args.latency_ms,
        "max_inflight_requests": args.max_inflight_requests,
        "persistent_workers": args.persistent_workers,
        "client_cpus": args.client_cpus,
        "storage_cpus": args.storage_cpus,
    }
    cached = cached_configs(args.short_side)
    names = configs(args.short_side, args.pillow_row)
    args.cache_root.mkdir(parents=True, exist_ok=True)
    with (
        _storage(args) as where,
        tempfile.TemporaryDirectory(prefix="presize-cache-", dir=args.cache_root) as caches,
    ):

        def spec(config: str, epochs: int) -> dict[str, Any]:
            return {
                "config": config,
                "client_cpus": args.client_cpus,
                "image_size": args.image_size,
                "resize_size": args.resize_size,
                "batch_size": args.batch_size,
                "workers": args.workers,
                "persistent": args.persistent_workers,
                "epochs": epochs,
                "seed": args.seed,
                "warmup_batches": args.warmup_batches,
                "max_inflight_requests": args.max_inflight_requests,
                "short_side": args.short_side,
                "s3_url": where["s3_url"],
                "local_dir": where["local_dir"],
                "cache_dir": str(Path(caches) / config.removesuffix(PILLOW)),
            }

        # The fills (and a local epoch for the page cache), then their entries on disk.
        fill: dict[str, Any] = {}
        for config in (*cached, "local"):
            result = _run_in_subprocess(spec(config, 1), where["env"], args.run_timeout)
            fill[config] = {"images_per_s": _rates(result)[0], "run": result}
            print(f"fill {config}: {fill[config]['images_per_s']:.0f} img/s", flush=True)
        os.sync()
        bytes_per_sample = {"original": where["original_bytes_per_sample"]}
        for config in cached:
            described = describe_cache(str(Path(caches) / config))
            if described["entries"] != args.images:
                raise RuntimeError(
                    f"the {config} cache holds {described['entries']} entries after its fill, "
                    f"not {args.images}"
                )
            fill[config]["entries"] = described["entries"]
            fill[config]["forms"] = described["forms"]
            bytes_per_sample[config] = described["bytes"] / described["entries"]
        report["fill"] = {c: {k: v for k, v in f.items() if k != "run"} for c, f in fill.items()}
        report["bytes_per_sample"] = bytes_per_sample

        # The timed runs: later epochs, every cached read a hit.
        proxy = where["proxy"]
        _reset_when_quiet(proxy)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
        for repeat in range(args.repeats):
            for config in _order(repeat, names):
                result = _run_in_subprocess(
                    spec(config, args.epochs), where["env"], args.run_timeout
                )
                result["repeat"] = repeat
                runs[config].append(result)
                whole, steady = _rates(result)
                steady_text = "n/a" if steady is None else f"{steady:.0f}"
                print(
                    f"repeat {repeat} {config}: whole {whole:.0f} img/s, "
                    f"steady {steady_text} img/s",
                    flush=True,
                )
        gets = int(proxy.stats()["requests_by_method"].get("GET", 0))
        # Each cached run lists the root when its dataset is made (a GET per 1000 keys);
        # the rest would be objects fetched, which a filled cache never does.
        listings = args.repeats * (len(names) - 2) * -(-args.images // 1000)
        report["timed_runs_gets"] = gets
        report["timed_runs_listing_gets"] = listings
        report["timed_runs_object_gets"] = gets - listings

    report["rows"] = [_row(config, runs[config], args.short_side) for config in names]
    report["ratios"] = _ratios(report["rows"], cached)
    return report


def _row(config: str, results: list[dict[str, Any]], short_side: int) -> dict[str, Any]:
    rates = [_rates(r) for r in results]
    epochs = [e for r in results for e in r["epochs"]]
    misses = [r["cache_misses"] for r in results if r["cache_misses"] is not None]
    return {
        "config": config,
        "title": title(config, short_side),
        "whole_images_per_s": _summary([w for w, _ in rates]),
        "steady_images_per_s": _summary([s for _, s in rates]),
        "first_batch_s": statistics.median(e["first_batch_s"] for e in epochs),
        "cpu_ms_per_image": statistics.median(e["cpu_ms_per_image"] for e in epochs),
        "warmup_batches": results[0]["warmup_batches"],
        "batches_per_epoch": results[0]["batches_per_epoch"],
        "cache_misses": sum(misses) if misses else None,
        "runs": results,
    }


def _ratios(rows: Sequence[dict[str, Any]], cached: dict[str, str]) -> list[dict[str, Any]]:
    """Each configuration against ``stock`` and ``local``: medians over medians, and per
    repeat (the two runs of one repeat)."""
    by = {r["config"]: r for r in rows}
    out = []
    for config in ("local", *cached, *(r["config"] for r in rows if r["config"].endswith(PILLOW))):
        for base in ("stock", "local"):
            if base == config:
                continue
            entry: dict[str, Any] = {"config": config, "against": base}
            for measure_ in ("whole", "steady"):
                mine = by[config][f"{measure_}_images_per_s"]
                theirs = by[base][f"{measure_}_images_per_s"]
                if mine is None or theirs is None:
                    entry[measure_] = None
                    continue
                per_repeat = [
                    a / b if a is not None and b is not None else None
                    for a, b in zip(mine["values"], theirs["values"], strict=True)
                ]
                ratio = mine["median"] / theirs["median"]
                target = TARGETS[cached[config]] if base == "stock" and config in cached else None
                entry[measure_] = {
                    "ratio": ratio,
                    "per_repeat": per_repeat,
                    "target": target,
                    "met": None if target is None else ratio >= target,
                }
            out.append(entry)
    return out


def _rate_text(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "n/a"
    return f"{summary['median']:.0f} ({summary['min']:.0f}-{summary['max']:.0f})"


def _ratio_text(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "n/a"
    text = f"{figure['ratio']:.2f}x"
    if figure["target"] is not None:
        text += f" (target >= {figure['target']:g}x: {'met' if figure['met'] else 'missed'})"
    per_repeat = ", ".join("n/a" if v is None else f"{v:.2f}" for v in figure["per_repeat"])
    return f"{text}; per repeat {per_repeat}"


def format_report(report: dict[str, Any]) -> str:
    sizes = report["bytes_per_sample"]
    lines = [
        f"{report['images']} images, {report['workers']} worker(s) on CPUs "
        f"{report['client_cpus']}, batch {report['batch_size']}, "
        f"Resize({report['resize_size']}) + CenterCrop({report['image_size']}), "
        f"{report['epochs']} epochs per run, {report['repeats']} repeats; "
        f"S3 at +{report['latency_ms']:g} ms; object GETs over the timed runs: "
        f"{report['timed_runs_object_gets']} (target 0; {report['timed_runs_gets']} GETs less "
        f"{report['timed_runs_listing_gets']} listing pages)",
        "",
        "| configuration | img/s, whole epochs: median (range) | img/s, steady state: median "
        "(range) | first batch, s | CPU ms/image | cache misses |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        misses = "" if r["cache_misses"] is None else str(r["cache_misses"])
        lines.append(
            f"| {r['config']}: {r['title']} | {_rate_text(r['whole_images_per_s'])} "
            f"| {_rate_text(r['steady_images_per_s'])} | {r['first_batch_s']:.3f} "
            f"| {r['cpu_ms_per_image']:.2f} | {misses} |"
        )
    lines += [
        "",
        "| configuration | against | whole epochs | steady state |",
        "|---|---|---|---|",
    ]
    for c in report["ratios"]:
        lines.append(
            f"| {c['config']} | {c['against']} | {_ratio_text(c['whole'])} "
            f"| {_ratio_text(c['steady'])} |"
        )
    lines += [
        "",
        "| form | disk bytes per sample | fill epoch img/s |",
        "|---|---|---|",
        f"| original JPEG | {sizes['original']:.0f} | |",
    ]
    for config in cached_configs(report["short_side"]):
        lines.append(
            f"| {config} | {sizes[config]:.0f} | {report['fill'][config]['images_per_s']:.0f} |"
        )
    return "\n".join(lines)


def _cpus(text: str) -> list[int]:
    return [int(c) for c in text.split(",") if c.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.presize", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--epochs", type=int, default=3, help="epochs per timed run")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--image-size", type=int, default=224, help="CenterCrop's size")
    p.add_argument("--resize-size", type=int, default=256, help="Resize's shorter side")
    p.add_argument("--short-side", type=int, default=256, help="Presize's shorter side")
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument(
        "--pillow-row",
        action="store_true",
        help="also the JPEG cache decoded by Pillow alone (simplejpeg hidden from that run)",
    )
    p.add_argument("--warmup-batches", type=int, default=1, help="at least, per epoch")
    p.add_argument(
        "--max-inflight-requests", type=int, default=0, help="per process (0: self-tuned)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=50.0, help="first-byte delay per GET")
    p.add_argument("--client-cpus", type=_cpus, default=[0])
    p.add_argument("--storage-cpus", type=_cpus, default=[1])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".bench/data")
    p.add_argument("--s3-dir", type=Path, default=REPO_ROOT / ".bench/s3")
    p.add_argument(
        "--cache-root",
        type=Path,
        default=REPO_ROOT / ".bench",
        help="the caches are made (and removed) in a new directory under this one",
    )
    p.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--smoke", action="store_true", help="tiny CI run: " + json.dumps(SMOKE))
    p.add_argument("--run", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run:
        result = run(json.loads(Path(args.run[0]).read_text()))
        Path(args.run[1]).write_text(json.dumps(result))
        return 0
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
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
