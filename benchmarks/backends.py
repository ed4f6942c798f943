"""Our loader over every backend against local disk, and the client CPU per GET of each.

``python -m benchmarks.backends`` starts each backend's local server (S3 on SeaweedFS and on
``rclone serve s3``, GCS on fake-gcs-server, Azure Blob on Azurite), all pinned to the
storage CPUs, and fills each with the benchmark's JPEG dataset (:mod:`.data`). Two sections,
each measured within this one run:

- ``steady``: ``ImageFolder`` + ``ConcurrentDataLoader`` over each backend through the
  latency proxy (+``--latency-ms``), against the same loader over the dataset's local
  directory; one fresh, CPU-pinned subprocess per run (:mod:`.measure`: warm-up, then a
  window of ``--run-images``), the runs of each repeat in a rotated order, medians compared.
  The target is at least 0.95x local disk for every backend.
- ``cpu``: this process (pinned to the client CPUs) GETs ``--objects`` objects of ``--size``
  bytes from each server directly (no proxy), ``--concurrency`` in flight, through the whole
  fetch path (limits, hedging, retries, checksums checked); client CPU microseconds per GET,
  the median of ``--repeats`` passes, with obstore reading the same S3 servers beside it.

``--smoke`` runs a tiny version for tests: it proves the harness works and its figures are
finite, nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.configs import LoaderParams
from benchmarks.data import DatasetSpec, ensure_local
from benchmarks.measure import pin_to
from benchmarks.run import REGION, Runner

REPO_ROOT = Path(__file__).resolve().parents[1]
BUCKET = "backends"
#: backend -> the name of its test server class in ``concurrent_loader.testing``
SERVERS = {
    "s3": "LocalS3Server",
    "rclone": "RcloneS3Server",
    "gcs": "FakeGcsServer",
    "azure": "AzuriteServer",
}
SMOKE = {
    "images": 256,
    "batch_size": 16,
    "run_images": 64,
    "repeats": 1,
    "objects": 40,
    "size": 20_000,
}


def pin_process_tree(pid: int, cpus: list[int]) -> None:
    """Pin every thread of ``pid`` and of its descendants (a Go or Node server has its
    threads before we can pin it) to ``cpus``."""
    import psutil

    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for thread in proc.threads():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread.id, cpus)


@contextlib.contextmanager
def started(backend: str, storage_cpus: list[int]) -> Iterator[Any]:
    """``backend``'s test server, started, pinned to ``storage_cpus``, with one bucket."""
    import concurrent_loader.testing as testing

    server = getattr(testing, SERVERS[backend])()
    with server:
        pin_process_tree(server.pid, storage_cpus)
        server.create_bucket(BUCKET)
        yield server


def loader_spec(args: argparse.Namespace, train_dir: Path, config: Any | None) -> dict[str, Any]:
    """A ``benchmarks.measure`` spec: the loader over ``config`` (None: local disk)."""
    params = LoaderParams(
        config="ours-local" if config is None else "ours-store",
        batch_size=args.batch_size,
        workers=args.workers,
        image_size=224,
        seed=0,
        max_inflight_requests=0,
        endpoint_url="",
        region=REGION,
        bucket=BUCKET,
        prefix="train/",
        local_train_dir=str(train_dir.resolve()),
        store_config=base64.b64encode(pickle.dumps(config)).decode() if config else "",
    )
    return {
        "kind": "loader",
        "client_cpus": args.client_cpus,
        "warmup_batches": 3,
        "run_images": args.run_images,
        "params": asdict(params),
    }


def steady(args: argparse.Namespace, stack: contextlib.ExitStack, train_dir: Path) -> dict:
    """Images/s of each backend (through the proxy) and of local disk, per repeat."""
    from concurrent_loader.testing import ProxyProcess

    configs: dict[str, Any] = {"local": None}
    for backend, server in args.servers.items():
        server.upload_dir(train_dir, BUCKET, "train/")
        proxy = stack.enter_context(
            ProxyProcess(
                upstream=server.endpoint_url,
                latency_ms=args.latency_ms,
                cpus=set(args.storage_cpus),
            )
        )
        configs[backend] = server.store_config(BUCKET, "train/", endpoint_url=proxy.endpoint_url)
    runner = Runner(
        args, dict(os.environ), Path(stack.enter_context(tempfile.TemporaryDirectory()))
    )
    rates: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            result = runner.measure(loader_spec(args, train_dir, configs[name]))
            if "error" in result:
                raise RuntimeError(f"{name}: {result['error']}\n{result.get('log_tail', '')}")
            rates[name].append(result["images_per_s"])
            print(f"  steady {name}: {result['images_per_s']:.0f} images/s", file=sys.stderr)
    local = statistics.median(rates["local"])
    return {
        name: {
            "images_per_s": runs,
            "median": statistics.median(runs),
            "vs_local": statistics.median(runs) / local,
        }
        for name, runs in rates.items()
    }


async def _gets(fetch: Callable[[str], Any], keys: list[str], concurrency: int, size: int) -> None:
    queue = iter(keys)

    async def lane() -> None:
        for key in queue:
            got = await fetch(key)
            if got != size:
                raise RuntimeError(f"{key}: {got} bytes, expected {size}")

    await asyncio.gather(*(lane() for _ in range(concurrency)))


@contextlib.asynccontextmanager
async def ours(server: Any) -> Any:
    from concurrent_loader.config import FetchConfig
    from concurrent_loader.fetch import FetchClient

    config = FetchConfig()
    client = FetchClient(server.store_config(BUCKET, "cpu/").open(config), config)
    try:

        async def fetch(key: str) -> int:
            return len(await client.get(key))

        yield fetch
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def obstore_s3(server: Any) -> Any:
    from obstore.store import S3Store

    store = S3Store(
        BUCKET,
        prefix="cpu",
        endpoint=server.endpoint_url,
        region=server.region,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )

    async def fetch(key: str) -> int:
        import obstore

        return len(await (await obstore.get_async(store, key)).bytes_async())

    yield fetch


async def _cpu_pass(client: Any, server: Any, keys: list[str], args: argparse.Namespace) -> float:
    """Client CPU microseconds per GET over ``keys``, after a warm-up of two rounds."""
    async with client(server) as fetch:
        await _gets(fetch, keys[: 2 * args.concurrency], args.concurrency, args.size)
        before = time.process_time()
        await _gets(fetch, keys, args.concurrency, args.size)
        return (time.process_time() - before) / len(keys) * 1e6


def cpu_per_get(args: argparse.Namespace) -> dict:
    """Client CPU microseconds per GET, per backend (and obstore on the S3 servers)."""
    keys = [f"{i:06d}.bin" for i in range(args.objects)]
    with tempfile.TemporaryDirectory() as objects:
        data = random.Random(0).randbytes(args.size)
        for key in keys:
            Path(objects, key).write_bytes(data)
        for server in args.servers.values():
            server.upload_dir(objects, BUCKET, "cpu/")
    clients: list[tuple[str, Any, Any]] = []
    for backend, server in args.servers.items():
        clients.append((backend, server, ours))
        if backend in ("s3", "rclone"):
            clients.append((f"obstore ({backend})", server, obstore_s3))
    runs: dict[str, list[float]] = {name: [] for name, _, _ in clients}
    for repeat in range(args.repeats):
        turn = repeat % len(clients)
        for name, server, client in clients[turn:] + clients[:turn]:
            runs[name].append(asyncio.run(_cpu_pass(client, server, keys, args)))
    return {name: {"us_per_get": r, "median": statistics.median(r)} for name, r in runs.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default=",".join(SERVERS), help="of " + ", ".join(SERVERS))
    p.add_argument("--sections", default="steady,cpu")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--run-images", type=int, default=1280, help="images in the timed window")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=None, help="default: one per client CPU")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--objects", type=int, default=2000, help="cpu: objects per pass")
    p.add_argument("--size", type=int, default=110_000, help="cpu: bytes per object")
    p.add_argument("--concurrency", type=int, default=64, help="cpu: GETs in flight")
    p.add_argument("--run-timeout", type=float, default=600.0)
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT / ".bench/data")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/out/backends.json")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests: " + json.dumps(SMOKE))
    args = p.parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    cpus = sorted(os.sched_getaffinity(0))
    args.storage_cpus = cpus[-1:]
    args.client_cpus = [c for c in cpus if c not in args.storage_cpus] or cpus
    args.workers = args.workers or len(args.client_cpus)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(SERVERS)
    if unknown:
        p.error(f"unknown backends {sorted(unknown)}: choose from {', '.join(SERVERS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    spec = DatasetSpec(images=args.images)
    local, _ = ensure_local(spec, args.data_dir)
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "out"}}
    with contextlib.ExitStack() as stack:
        args.servers = {
            b: stack.enter_context(started(b, args.storage_cpus)) for b in args.backends
        }
        if "steady" in args.sections:
            results["steady"] = steady(args, stack, local.train_dir)
        if "cpu" in args.sections:
            affinity = sorted(os.sched_getaffinity(0))
            pin_to(args.client_cpus)  # this process makes the GETs, apart from the servers
            try:
                results["cpu"] = cpu_per_get(args)
            finally:
                pin_to(affinity)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    for name, row in results.get("steady", {}).items():
        print(f"steady  {name:8s} {row['median']:8.0f} images/s  {row['vs_local']:.3f}x local")
    for name, row in results.get("cpu", {}).items():
        print(f"cpu     {name:16s} {row['median']:8.1f} us/GET")
    return results


if __name__ == "__main__":
    main()
