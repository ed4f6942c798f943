"""Train a ResNet-style image classifier from S3 and measure how much of it waits for data.

The pipeline is the one the library is for: ``ImageFolder`` over ``s3://`` (or a local
directory) -> ``ConcurrentDataLoader`` (many GETs in flight, decode on threads, pinned
batches) -> ``CUDAPrefetcher`` (copy on a side stream, uint8 -> normalised float on the GPU)
-> the model. :func:`~concurrent_loader.gpu.measure_stalls` times every step, split into
waiting for the batch and computing, then runs the same steps on one batch replayed from
memory; the loader-fed rate over that loading-free rate is the share of the model's speed
the loader delivers.

Data, one of:

* S3 (default): ``--endpoint-url URL --bucket B --prefix train/`` for an existing server,
  credentials from the standard ``AWS_*`` environment variables; or ``--start-server`` to
  run a local S3 server (and, with ``--latency-ms``, a proxy adding network latency) filled
  with ``--data-dir`` or with the generated benchmark dataset.
* ``--local``: the same data read from disk (``--data-dir``, or the generated dataset).
* ``--synthetic``: no loading at all, only the model's step rate.

On a machine without a GPU everything runs on the CPU; keep it small there::

    python examples/train.py --synthetic --steps 20 --batch-size 32 --image-size 64
    python examples/train.py --local --data-dir /data/imagenet/train --steps 20 \\
        --batch-size 32 --image-size 64
    python examples/train.py --start-server --images 2000 --latency-ms 20 --steps 20 \\
        --batch-size 32 --image-size 64

On a GPU the defaults (batch 256, 224 x 224, ``--channels-last``) are an ImageNet-like
load; ``--model resnet18`` uses torchvision's when it is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from concurrent_loader.gpu import CUDAPrefetcher, StallMeter, measure_stalls, repeat_batch
from concurrent_loader.stores import S3Config

# ImageNet statistics, in 0-1 units; the prefetcher applies them to 0-255 input on the GPU.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO_ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("train")


# -- the model ------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18's block)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """A four-stage ResNet, one block per stage: fast enough to train on a CPU."""

    def __init__(self, num_classes: int, widths: Sequence[int] = (32, 64, 128, 256)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 2, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        blocks = []
        in_channels = widths[0]
        for i, width in enumerate(widths):
            blocks.append(BasicBlock(in_channels, width, stride=1 if i == 0 else 2))
            in_channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build_model(name: str, num_classes: int) -> nn.Module:
    if name == "small":
        return SmallResNet(num_classes)
    try:
        from torchvision.models import resnet18
    except ImportError:
        raise SystemExit("--model resnet18 needs torchvision; use --model small") from None
    model: nn.Module = resnet18(num_classes=num_classes)
    return model


def make_train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, dtype: torch.dtype
) -> tuple[Callable[[Any], torch.Tensor], list[torch.Tensor]]:
    """One SGD step on an ``(images, labels)`` batch; also returns the recorded losses."""
    loss_fn = nn.CrossEntropyLoss()
    losses: list[torch.Tensor] = []
    # Images arrive in ``dtype``; autocast runs the model in it too (weights stay float32).
    autocast = dtype != torch.float32

    def step(batch: Any) -> torch.Tensor:
        images, labels = batch
        with torch.autocast(device.type, dtype=dtype, enabled=autocast):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # Kept on the device: reading it here would synchronise every step.
        losses.append(loss.detach())
        return loss

    return step, losses


# -- the data -------------------------------------------------------------------------


def generated_dataset(args: argparse.Namespace) -> Any:
    """The benchmark dataset (generated once, cached under ``--cache-dir``)."""
    # benchmarks/ is a package at the repository root, beside this examples/ folder.
    sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.data import DatasetSpec, ensure_local

    spec = DatasetSpec(images=args.images, classes=args.classes)
    local, made = ensure_local(spec, Path(args.cache_dir))
    log.info("%s dataset %s (%d files)", "generated" if made else "cached", spec.name, local.files)
    return local


def open_dataset(args: argparse.Namespace, stack: contextlib.ExitStack) -> tuple[Any, str]:
    """The ``ImageFolder`` the arguments ask for, and a line saying where it reads from."""
    from concurrent_loader import FetchConfig, ImageFolder

    if args.local:
        root = Path(args.data_dir) if args.data_dir else generated_dataset(args).train_dir
        return ImageFolder(root, image_size=args.image_size), f"local disk {root}"

    storage: dict[str, Any] = {}  # the S3 backend's options (its config, the root)
    if args.start_server:
        from concurrent_loader.testing import LocalS3Server, ProxyProcess

        server = stack.enter_context(LocalS3Server())
        if args.data_dir:
            bucket, prefix = "train-data", "train/"
            server.create_bucket(bucket)
            server.upload_dir(args.data_dir, bucket, prefix=prefix)
        else:
            local = generated_dataset(args)  # puts benchmarks/ on sys.path first
            from benchmarks.data import TRAIN_PREFIX, ensure_uploaded

            bucket, _ = ensure_uploaded(local, server)
            prefix = TRAIN_PREFIX
        endpoint_url = server.endpoint_url
        if args.latency_ms > 0:
            proxy = stack.enter_context(
                ProxyProcess(upstream=server.endpoint_url, latency_ms=args.latency_ms)
            )
            endpoint_url = proxy.endpoint_url
        storage |= {
            "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key,
            "region": server.region,
        }
        where = f"local S3 server + {args.latency_ms:g} ms latency"
    else:
        if not (args.bucket and (args.endpoint_url or os.environ.get("AWS_ENDPOINT_URL"))):
            raise SystemExit(
                "S3 needs --bucket and --endpoint-url (or AWS_ENDPOINT_URL); "
                "or use --start-server, --local or --synthetic"
            )
        bucket, prefix = args.bucket, args.prefix
        endpoint_url = args.endpoint_url or os.environ["AWS_ENDPOINT_URL"]
        where = f"S3 at {endpoint_url}"
    root = f"s3://{bucket}/{prefix}"
    dataset = ImageFolder(
        S3Config.from_url(root, endpoint_url=endpoint_url, **storage),
        image_size=args.image_size,
        # How bytes are fetched is the dataset's: its fetch config.
        fetch_config=FetchConfig(max_inflight_requests=args.max_inflight_requests),
    )
    return dataset, f"{where}, {root}"


def forever(prefetcher: CUDAPrefetcher) -> Iterator[Any]:
    """Epoch after epoch, so ``--steps`` may exceed one pass over a small dataset."""
    while True:
        yield from prefetcher


# -- the runs -------------------------------------------------------------------------


def run_synthetic(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    model, optimizer = setup_model(args, device, args.classes)
    step, losses = make_train_step(model, optimizer, device, dtype)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, args.classes, (args.batch_size,), device=device)
    batch = (images.to(dtype), labels)
    meter = StallMeter(device=device, warmup_steps=args.warmup_steps)
    for b in meter.iterate(repeat_batch(batch, args.warmup_steps + args.steps)):
        step(b)
    print(f"synthetic:  {meter.report()}")
    print(f"final loss {float(losses[-1]):.3f}")


def run_loader(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    from concurrent_loader import ConcurrentDataLoader

    with contextlib.ExitStack() as stack:
        dataset, where = open_dataset(args, stack)
        loader = ConcurrentDataLoader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.num_workers,
            decode_threads=args.decode_threads,
            pin_memory=device.type == "cuda",
            persistent_workers=args.num_workers > 0,
        )
        if len(loader) == 0:
            raise SystemExit(f"no batches: the dataset at {where} is empty")
        print(f"data: {len(dataset)} images in {len(dataset.classes)} classes from {where}")
        model, optimizer = setup_model(args, device, len(dataset.classes))
        step, losses = make_train_step(model, optimizer, device, dtype)
        prefetcher = stack.enter_context(
            CUDAPrefetcher(
                loader,
                device=device,
                depth=args.depth,
                mean=MEAN,
                std=STD,
                dtype=dtype,
                channels_last=args.channels_last,
            )
        )
        batches = stack.enter_context(contextlib.closing(forever(prefetcher)))
        started = time.perf_counter()
        comparison = measure_stalls(
            step, batches, steps=args.steps, warmup_steps=args.warmup_steps, device=device
        )
        elapsed = time.perf_counter() - started
    print(comparison)
    print(
        f"images/s: {comparison.loader.samples_per_s:.1f} loader-fed, "
        f"{comparison.synthetic.samples_per_s:.1f} synthetic; "
        f"data stall {comparison.loader.stall_share:.1%} of step time"
    )
    print(f"final loss {float(losses[-1]):.3f}; {elapsed:.1f} s in all")


def setup_model(
    args: argparse.Namespace, device: torch.device, num_classes: int
) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = build_model(args.model, num_classes).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {args.model} ({params / 1e6:.2f} M parameters) on {device}, batch "
        f"{args.batch_size}, {args.image_size} x {args.image_size}, {args.dtype}"
    )
    return model, optimizer


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_argument_group("data")
    mode = source.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="read the data from local disk")
    mode.add_argument("--synthetic", action="store_true", help="no loading: batches in memory")
    mode.add_argument("--start-server", action="store_true", help="run a local S3 server")
    source.add_argument("--data-dir", help="an existing ImageFolder tree (<class>/<image>)")
    source.add_argument("--endpoint-url", help="S3 endpoint (default: $AWS_ENDPOINT_URL)")
    source.add_argument("--bucket", help="S3 bucket")
    source.add_argument("--prefix", default="train/", help="key prefix of the ImageFolder tree")
    source.add_argument("--latency-ms", type=float, default=20.0, help="added by the proxy")
    source.add_argument("--images", type=int, default=2000, help="generated dataset size")
    source.add_argument("--classes", type=int, default=10, help="generated dataset classes")
    source.add_argument("--cache-dir", default=str(REPO_ROOT / ".bench" / "data"))
    run = parser.add_argument_group("training")
    run.add_argument("--model", choices=["small", "resnet18"], default="small")
    run.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    run.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    run.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    run.add_argument("--steps", type=int, default=50, help="measured steps")
    run.add_argument("--warmup-steps", type=int, default=5, help="steps run before measuring")
    run.add_argument("--batch-size", type=int, default=256)
    run.add_argument("--image-size", type=int, default=224)
    run.add_argument("--lr", type=float, default=0.1)
    loading = parser.add_argument_group("loading")
    loading.add_argument("--num-workers", type=int, default=min(8, os.cpu_count() or 1))
    loading.add_argument("--max-inflight-requests", type=int, default=64)
    loading.add_argument("--decode-threads", type=int, default=None)
    loading.add_argument("--depth", type=int, default=2, help="batches prefetched to the GPU")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log.warning("CUDA is not available; training on the CPU")
        device = torch.device("cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    dtype = DTYPES[args.dtype]
    if args.synthetic:
        run_synthetic(args, device, dtype)
    else:
        run_loader(args, device, dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
