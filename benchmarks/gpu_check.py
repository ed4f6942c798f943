"""The GPU check: does remote data keep a real GPU busy? One unattended run, one folder of figures.

Made for a bare CUDA machine with PyTorch, torchvision, Pillow, NumPy and aiohttp installed
and no network (``scripts/gpu_check.sh`` installs the one wheel it lacks, ``anycrc``, from
``.bench/wheels``). It runs, each stage on its own so a failing one leaves the others' figures:

1. ``tests/gpu`` under pytest on CUDA: passed / failed / skipped;
2. an ImageNet-like dataset generated on local disk (``benchmarks.data``, ~110 KB JPEGs);
3. JPEG decode to 224 x 224: our fused CPU decode on one core and on every core, against
   ``torchvision.io.decode_jpeg`` batched on the GPU (plus the resize there);
4. a ResNet-50 training step (torchvision, random weights, bf16 autocast, channels_last)
   fed (a) by a batch replayed on the GPU, (b) by our loader from local disk, (c) by our
   loader over plain HTTP from a local file server behind the latency proxy at +50 ms,
   (d, e) the same two with the JPEG decode on the GPU (``decode_on="cuda"``), and
   (f, g, h) over HTTP through a pre-sized node cache (``Presize(256)``: JPEG, raw pixels,
   JPEG decoded on the GPU; filled by one epoch first), each through ``CUDAPrefetcher``, timed by
   :func:`~concurrent_loader.gpu.measure_stalls`. Every loader decodes to torchvision's
   ``Resize(256) + CenterCrop(224)`` (``--resize-size``).

It writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` (default ``$OUT``) after
every stage. ``--dry-run`` runs the same code on the CPU at toy sizes, so CI keeps it
working: ``python -m benchmarks.gpu_check --dry-run --out /tmp/gpu-check``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from concurrent_loader import ConcurrentDataLoader, ImageFolder
from concurrent_loader.decode.image import ImageDecoder
from concurrent_loader.gpu import CUDAPrefetcher, measure_stalls

from .data import DatasetSpec, LocalDataset, ensure_local, iter_local_files

REPO = Path(__file__).resolve().parents[1]
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Sizes:
    images: int
    batch_size: int
    image_size: int
    steps: int
    warmup_steps: int
    workers: int
    model: str
    #: the shorter side before the centre crop (torchvision's Resize), None: cover-resize
    resize_size: int | None
    #: the cores the training process and its workers run on; the file server and the
    #: proxy get the others, as a remote store would not share the client's cores
    client_cpus: int


def sizes_for(args: argparse.Namespace) -> Sizes:
    cpus = os.cpu_count() or 1
    client = cpus if cpus < 4 else cpus - max(1, cpus // 5)
    if args.dry_run:
        return Sizes(64, 8, 64, 2, 1, 2, "small", 72, client)
    # Leave the main process (batch hand-off, CUDA launches) a core of the client's.
    workers = args.workers or max(1, client - 1)
    return Sizes(
        args.images,
        args.batch_size,
        224,
        args.steps,
        args.warmup_steps,
        workers,
        "resnet50",
        args.resize_size or None,
        client,
    )


class Report:
    """The figures so far, rewritten to ``out`` after every stage."""

    def __init__(self, out: Path, sizes: Sizes, dry_run: bool, feeds: str = "") -> None:
        self.out = out
        #: the training feeds to run (``train_`` stages without the prefix); empty: all
        self.feeds = {f for f in feeds.split(",") if f}
        self.data: dict[str, Any] = {"sizes": sizes.__dict__, "dry_run": dry_run, "stages": {}}

    def stage(self, name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        if self.feeds and name.startswith("train_") and name[6:] not in self.feeds:
            return None
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            result: dict[str, Any] | None = {"status": "ok", **run()}
        except Exception as exc:
            traceback.print_exc()
            result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        assert result is not None
        result["seconds"] = round(time.perf_counter() - started, 1)
        self.data["stages"][name] = result
        print(f"   {json.dumps(result)}", flush=True)
        self.write()
        return result if result["status"] == "ok" else None

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=1))
        (self.out / "gpu_check.md").write_text(markdown(self.data))


def markdown(data: dict[str, Any]) -> str:
    env = data.get("environment", {})
    stages = data["stages"]
    sizes = data["sizes"]
    lines = [
        f"GPU check on {env.get('device', '?')}, {env.get('cpus', '?')} CPU cores, torch "
        f"{env.get('torch', '?')}, torchvision {env.get('torchvision', '-')}"
        f"{' (dry run)' if data['dry_run'] else ''}",
        f"batch {sizes['batch_size']}, {sizes['image_size']} px, {sizes['steps']} steps after "
        f"{sizes['warmup_steps']}, {sizes['images']} images, {sizes['workers']} workers on "
        f"{sizes['client_cpus']} client cores (file server and proxy on the others)",
        "",
    ]
    tests = stages.get("tests", {})
    lines.append(f"- tests/gpu: {tests.get('summary', tests.get('error', 'not run'))}")
    decode = stages.get("decode", {})
    for key, label in (
        ("cpu_one_core", "CPU fused decode, 1 core"),
        ("cpu_all_cores", "CPU fused decode, all cores"),
        ("gpu_nvjpeg_only", "GPU nvJPEG batched decode alone"),
        ("gpu_batched", "GPU batched decode + resize (the loader's)"),
    ):
        if key in decode:
            lines.append(f"- {label}: {decode[key]:.0f} images/s")
    if "gpu_over_one_core" in decode:
        lines.append(f"- GPU decode / one CPU core: {decode['gpu_over_one_core']:.1f}x")
    lines += [
        "",
        "| feed | images/s | data stall | vs synthetic | vs local (CPU decode) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    synthetic = stages.get("train_synthetic", {}).get("images_per_s")
    local = stages.get("train_local", {}).get("images_per_s")
    for name, result in stages.items():
        if not name.startswith("train_"):
            continue
        if result["status"] != "ok":
            lines.append(
                f"| {name[6:]} | {result['status']}: {result.get('error', '')[:80]} | | | |"
            )
            continue
        rate = result["images_per_s"]
        lines.append(
            f"| {name[6:]} | {rate:.0f} | {result.get('stall_share', 0.0):.1%} | "
            f"{rate / synthetic:.3f} | "
            if synthetic
            else f"| {name[6:]} | {rate:.0f} | | | "
        )
        lines[-1] += f"{rate / local:.3f} |" if local else " |"
    return "\n".join(lines) + "\n"


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    env["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU only"
    with contextlib.suppress(ImportError):
        import torchvision

        env["torchvision"] = torchvision.__version__
    return env


def run_gpu_tests(out: Path, timeout_s: float) -> dict[str, Any]:
    log = out / "pytest_gpu.log"
    command = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider"]
    with log.open("wb") as f:
        proc = subprocess.run(
            command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    text = log.read_text(errors="replace")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", text)}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or text[-300:]
    if proc.returncode not in (0, 5):
        raise RuntimeError(f"pytest exited {proc.returncode}: {summary}")
    return {"summary": summary, **counts}


# -- decode ---------------------------------------------------------------------------


def decode_rates(local: LocalDataset, sizes: Sizes) -> dict[str, Any]:
    blobs = [path.read_bytes() for path, _ in iter_local_files(local.train_dir)]
    decoder = ImageDecoder(sizes.image_size, resize_size=sizes.resize_size)
    one = blobs[: max(8, len(blobs) // 8)]
    started = time.perf_counter()
    for blob in one:
        decoder(blob)
    result: dict[str, Any] = {"cpu_one_core": len(one) / (time.perf_counter() - started)}
    threads = os.cpu_count() or 1
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(decoder, blobs[:threads]))  # start the threads
        started = time.perf_counter()
        list(pool.map(decoder, blobs, chunksize=16))
        result["cpu_all_cores"] = len(blobs) / (time.perf_counter() - started)
    if torch.cuda.is_available():
        result.update(gpu_decode_rate(blobs, sizes))
        result["gpu_over_one_core"] = result["gpu_batched"] / result["cpu_one_core"]
    return result


def gpu_decode_rate(blobs: list[bytes], sizes: Sizes) -> dict[str, float]:
    """Images/s of nvJPEG alone, and of the loader's whole GPU batch decode (with resize)."""
    from torchvision.io import decode_jpeg

    from concurrent_loader.decode.encoded import EncodedImage
    from concurrent_loader.gpu.decode import EncodedBatchDecoder

    size = (sizes.image_size, sizes.image_size)
    encoded = [
        EncodedImage(b, size, decode_on="cuda", resize_size=sizes.resize_size) for b in blobs
    ]
    batches = [encoded[i : i + sizes.batch_size] for i in range(0, len(encoded), sizes.batch_size)]
    decoder = EncodedBatchDecoder(torch.device("cuda"))
    rates = {}
    for name, run in (
        ("gpu_nvjpeg_only", lambda b: decode_jpeg([e.tensor() for e in b], device="cuda")),
        ("gpu_batched", decoder),
    ):
        run(batches[0])
        torch.cuda.synchronize()
        started = time.perf_counter()
        for batch in batches:
            run(batch)
        torch.cuda.synchronize()
        rates[name] = len(encoded) / (time.perf_counter() - started)
    return rates


# -- training -------------------------------------------------------------------------


def build_model(sizes: Sizes, classes: int, device: torch.device) -> nn.Module:
    model: nn.Module
    if sizes.model == "resnet50":
        from torchvision.models import resnet50

        model = resnet50(num_classes=classes)
    else:
        sys.path.insert(0, str(REPO / "examples"))
        from train import SmallResNet

        model = SmallResNet(classes)
    return model.to(device).to(memory_format=torch.channels_last)


def train_step(model: nn.Module, device: torch.device) -> Callable[[Any], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(batch: Any) -> None:
        images, labels = batch
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def forever(prefetcher: CUDAPrefetcher) -> Generator[Any, None, None]:
    while True:
        yield from prefetcher


def train_fed(dataset: ImageFolder, sizes: Sizes, device: torch.device) -> dict[str, Any]:
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=sizes.batch_size,
        shuffle=True,
        num_workers=sizes.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=True,
        drop_last=True,
    )
    step = train_step(build_model(sizes, len(dataset.classes), device), device)
    with contextlib.ExitStack() as stack:
        prefetcher = stack.enter_context(
            CUDAPrefetcher(
                loader,
                device=device,
                depth=3,
                mean=MEAN,
                std=STD,
                dtype=torch.bfloat16,
                channels_last=True,
            )
        )
        batches = stack.enter_context(contextlib.closing(forever(prefetcher)))
        started = time.perf_counter()
        comparison = measure_stalls(
            step, batches, steps=sizes.steps, warmup_steps=sizes.warmup_steps, device=device
        )
        elapsed = time.perf_counter() - started
        stack.callback(dataset.close)
    return {
        "images_per_s": comparison.loader.samples_per_s,
        "stall_share": comparison.loader.stall_share,
        "replayed_images_per_s": comparison.synthetic.samples_per_s,
        "vs_replayed": comparison.rate_ratio,
        "step_p50_ms": comparison.loader.step_p50_s * 1e3,
        "step_p95_ms": comparison.loader.step_p95_s * 1e3,
        "wall_s": elapsed,
    }


def train_synthetic(sizes: Sizes, classes: int, device: torch.device) -> dict[str, Any]:
    images = (
        torch.randint(
            0, 256, (sizes.batch_size, 3, sizes.image_size, sizes.image_size), device=device
        )
        .float()
        .to(torch.bfloat16)
    )
    batch = (
        images.contiguous(memory_format=torch.channels_last),
        torch.randint(0, classes, (sizes.batch_size,), device=device),
    )
    step = train_step(build_model(sizes, classes, device), device)
    comparison = measure_stalls(
        step,
        iter([batch] * (sizes.warmup_steps + sizes.steps)),
        steps=sizes.steps,
        warmup_steps=sizes.warmup_steps,
        device=device,
    )
    return {"images_per_s": comparison.synthetic.samples_per_s, "stall_share": 0.0}


def image_sizes(sizes: Sizes) -> dict[str, Any]:
    return {"image_size": sizes.image_size, "resize_size": sizes.resize_size}


def fill_cache(dataset: ImageFolder, sizes: Sizes) -> float:
    """One epoch through ``dataset`` (filling its cache); returns its seconds."""
    loader = ConcurrentDataLoader(dataset, batch_size=sizes.batch_size, num_workers=sizes.workers)
    started = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - started


def remote_keys(local: LocalDataset) -> list[str]:
    return [f"{label}/{path.name}" for path, label in iter_local_files(local.train_dir)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy sizes")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0, help="default: CPUs - 4")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--resize-size", type=int, default=256, help="0: cover-resize")
    parser.add_argument("--server-processes", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/gpu-check-data"))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--feeds", default="", help="comma-separated feeds to train (all)")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out is required when $OUT is not set")
    sizes = sizes_for(args)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    report = Report(args.out, sizes, args.dry_run, args.feeds)
    report.data["environment"] = environment()
    report.write()
    if not args.skip_tests:
        report.stage("tests", lambda: run_gpu_tests(args.out, timeout_s=240))
    spec = DatasetSpec(images=sizes.images, classes=10)
    made: dict[str, Any] = {}
    if report.stage(
        "data",
        lambda: (
            made.update(local=ensure_local(spec, args.data_dir)[0])
            or {"images": spec.images, "mean_bytes": made["local"].mean_object_bytes}
        ),
    ):
        local: LocalDataset = made["local"]
        report.stage("decode", lambda: decode_rates(local, sizes))
        # From here on this process and the workers it starts stay on the client's cores.
        os.sched_setaffinity(0, range(sizes.client_cpus))
        report.stage("train_synthetic", lambda: train_synthetic(sizes, spec.classes, device))
        report.stage(
            "train_local",
            lambda: train_fed(ImageFolder(local.train_dir, **image_sizes(sizes)), sizes, device),
        )
        run_remote(report, local, sizes, device, args)
        decode_on = "cuda" if device.type == "cuda" else "cpu"
        report.stage(
            "train_local_gpu_decode",
            lambda: train_fed(
                ImageFolder(local.train_dir, **image_sizes(sizes), decode_on=decode_on),
                sizes,
                device,
            ),
        )
    failed = [n for n, r in report.data["stages"].items() if r["status"] != "ok"]
    print(markdown(report.data))
    return 1 if failed else 0


def run_remote(
    report: Report,
    local: LocalDataset,
    sizes: Sizes,
    device: torch.device,
    args: argparse.Namespace,
) -> None:
    from concurrent_loader.cache import CacheConfig
    from concurrent_loader.decode import Presize
    from concurrent_loader.testing.files import FileServer
    from concurrent_loader.testing.proxy import ProxyProcess

    keys = remote_keys(local)
    cpus = os.cpu_count() or 1
    rig = range(sizes.client_cpus, cpus) if sizes.client_cpus < cpus else range(cpus)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            FileServer(local.train_dir, processes=args.server_processes, cpus=rig)
        )
        proxy = stack.enter_context(
            ProxyProcess(upstream=server.endpoint_url, latency_ms=args.latency_ms, cpus=rig)
        )
        root = f"{proxy.endpoint_url}/"
        root_dir = roomiest([args.data_dir.parent, REPO, Path("/dev/shm")])
        caches = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-", dir=root_dir))
        )
        free_gb = shutil.disk_usage(caches).free / 1e9
        report.data["cache_root"] = {"path": str(root_dir), "free_gb": round(free_gb, 1)}
        short_side = sizes.resize_size or sizes.image_size
        gpu = {"decode_on": "cuda" if device.type == "cuda" else "cpu"}
        presized = {
            fmt: {"cache": CacheConfig(str(caches / fmt), presize=Presize(short_side, format=fmt))}
            for fmt in ("jpeg", "raw")
        }
        for name, extra in (
            ("train_remote", {}),
            ("train_remote_gpu_decode", gpu),
            ("train_remote_presized_jpeg", presized["jpeg"]),
            ("train_remote_presized_raw", presized["raw"]),
            ("train_remote_presized_jpeg_gpu_decode", {**presized["jpeg"], **gpu}),
        ):
            before = (server.cpu_seconds(), proxy.cpu_seconds())
            result = report.stage(
                name,
                lambda extra=extra: train_remote(root, keys, extra, sizes, device),  # type: ignore[misc]
            )
            if result is not None:
                result["server_cpu_s"] = round(server.cpu_seconds() - before[0], 1)
                result["proxy_cpu_s"] = round(proxy.cpu_seconds() - before[1], 1)
                report.write()


def train_remote(
    root: str, keys: list[str], extra: dict[str, Any], sizes: Sizes, device: torch.device
) -> dict[str, Any]:
    """``train_fed`` over the store at ``root``; with a cache, after one epoch fills it."""
    dataset = ImageFolder(root, keys=keys, **image_sizes(sizes), **extra)
    if "cache" not in extra:
        return train_fed(dataset, sizes, device)
    from concurrent_loader.cache import describe_cache

    fill_s = fill_cache(dataset, sizes)
    filled = describe_cache(extra["cache"].directory)
    result = train_fed(dataset, sizes, device)
    after = describe_cache(extra["cache"].directory)
    hits, misses = after["hits"] - filled["hits"], after["misses"] - filled["misses"]
    return {
        **result,
        "fill_epoch_s": round(fill_s, 1),
        "cache_entries": filled["entries"],
        "cache_gb": round(filled["bytes"] / 1e9, 2),
        "training_hit_rate": round(hits / max(1, hits + misses), 4),
    }


def roomiest(candidates: list[Path]) -> Path:
    """The existing directory among ``candidates`` with the most free space."""
    found = [c for c in candidates if c.is_dir()]
    return max(found, key=lambda c: shutil.disk_usage(c).free)


if __name__ == "__main__":
    sys.exit(main())
