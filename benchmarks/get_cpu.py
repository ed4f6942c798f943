"""Client CPU per signed GET: our ConnectionPool + SigV4Signer against the usual clients,
and our whole fetch path.

Each client runs the same workload inside this one process, pinned to ``--client-cpu``:
``--objects`` GETs of ``--size``-byte objects at ``--concurrency`` requests in flight, on
uvloop unless ``--no-uvloop``. Connections are warmed up first, so connection set-up is not
measured, and every object is read once before the first measured run, so the server's
caches are equally warm for all clients. The figures are wall time and the CPU time of
this process (all its threads, so obstore's Rust runtime counts too; the server never
does), repeated ``--repeats`` times in a rotating order; the table shows the median and
the min-max. With the server it starts, the server's CPU per GET is shown too.

Clients: ``ours`` (ConnectionPool + SigV4Signer), ``fetch-path`` (what a dataset runs by
default: a ``FetchClient`` over an ``S3Store`` under ``FetchConfig()``, so retry, the
self-tuned limit, deadlines, timing, hedging and checksum checks), ``fetch-path-unchecked``
(the same without checksum checks), ``aiohttp+ours`` (aiohttp with our
signer), ``aiohttp+botocore`` (aiohttp with botocore's S3SigV4Auth), ``aiobotocore``
(``get_object``), ``aiohttp-unsigned`` (anonymous GETs: the server must allow anonymous
reads) and ``obstore`` when importable.

Without ``--endpoint-url`` it starts :class:`concurrent_loader.testing.LocalS3Server`
pinned to ``--server-cpu``. Objects are uploaded with boto3 unless already there::

    python benchmarks/get_cpu.py --objects 2000 --size 110000 --concurrency 64 --client-cpu 0

The fetch path's CPU per GET, before and after a change: the same file run against two
checkouts (it imports the package of the tree it sits in), alternately, on a quiet machine::

    git worktree add /tmp/base <commit> && cp benchmarks/get_cpu.py /tmp/base/benchmarks/
    for i in 1 2 3 4 5 6; do for tree in /tmp/base .; do
        flock /tmp/bench.lock python $tree/benchmarks/get_cpu.py --repeats 2 \\
            --clients fetch-path,fetch-path-unchecked,ours
    done; done
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script (``python benchmarks/get_cpu.py``) the repository root is not on sys.path.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from concurrent_loader.stores.s3.sigv4 import (  # noqa: E402
    Credentials,
    SigV4Signer,
    encode_s3_path,
)
from concurrent_loader.transport import ConnectionPool, Origin  # noqa: E402

Fetch = Callable[[str], Awaitable[int]]
ClientFactory = Callable[["Target"], contextlib.AbstractAsyncContextManager[Fetch]]


@dataclass(frozen=True)
class Target:
    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str
    region: str
    concurrency: int

    @property
    def origin(self) -> Origin:
        return Origin.from_url(self.endpoint_url)


@dataclass(frozen=True)
class Run:
    client: str
    seconds: float
    cpu_seconds: float
    requests: int
    server_cpu_seconds: float | None


# -- clients ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def ours(target: Target) -> AsyncIterator[Fetch]:
    signer = SigV4Signer(target.region)
    credentials = Credentials(target.access_key, target.secret_key)
    origin, bucket = target.origin, target.bucket
    async with ConnectionPool(max_connections=target.concurrency) as pool:

        async def fetch(key: str) -> int:
            path = encode_s3_path(bucket, key)
            headers = signer.headers_for_get(origin.host_header, path, credentials)
            response = await pool.get(origin, path, headers, url=key)
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status} for {key}")
            return len(response.body)

        yield fetch


@contextlib.asynccontextmanager
async def _aiohttp_session(target: Target) -> AsyncIterator[Any]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=target.concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        yield session


async def _aiohttp_read(session: Any, url: Any, headers: Any, key: str) -> int:
    async with session.get(url, headers=headers) as response:
        body = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status} for {key}")
        return len(body)


@contextlib.asynccontextmanager
async def aiohttp_ours(target: Target) -> AsyncIterator[Fetch]:
    from yarl import URL

    signer = SigV4Signer(target.region)
    credentials = Credentials(target.access_key, target.secret_key)
    base, bucket = target.endpoint_url.rstrip("/"), target.bucket
    host_header = target.origin.host_header
    async with _aiohttp_session(target) as session:

        async def fetch(key: str) -> int:
            path = encode_s3_path(bucket, key)
            headers = signer.headers_for_get(host_header, path, credentials)
            return await _aiohttp_read(session, URL(base + path, encoded=True), headers, key)

        yield fetch


@contextlib.asynccontextmanager
async def aiohttp_botocore(target: Target) -> AsyncIterator[Fetch]:
    import botocore.auth
    import botocore.credentials
    from botocore.awsrequest import AWSRequest
    from yarl import URL

    auth = botocore.auth.S3SigV4Auth(
        botocore.credentials.Credentials(target.access_key, target.secret_key),
        "s3",
        target.region,
    )
    base, bucket = target.endpoint_url.rstrip("/"), target.bucket
    async with _aiohttp_session(target) as session:

        async def fetch(key: str) -> int:
            url = base + encode_s3_path(bucket, key)
            request = AWSRequest(method="GET", url=url)
            auth.add_auth(request)
            headers = dict(request.headers.items())
            return await _aiohttp_read(session, URL(url, encoded=True), headers, key)

        yield fetch


@contextlib.asynccontextmanager
async def aiobotocore(target: Target) -> AsyncIterator[Fetch]:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(max_pool_connections=target.concurrency, s3={"addressing_style": "path"})
    async with get_session().create_client(
        "s3",
        endpoint_url=target.endpoint_url,
        region_name=target.region,
        aws_access_key_id=target.access_key,
        aws_secret_access_key=target.secret_key,
        config=config,
    ) as client:
        bucket = target.bucket

        async def fetch(key: str) -> int:
            response = await client.get_object(Bucket=bucket, Key=key)
            async with response["Body"] as stream:
                return len(await stream.read())

        yield fetch


@contextlib.asynccontextmanager
async def aiohttp_unsigned(target: Target) -> AsyncIterator[Fetch]:
    from yarl import URL

    base, bucket = target.endpoint_url.rstrip("/"), target.bucket
    async with _aiohttp_session(target) as session:

        async def fetch(key: str) -> int:
            url = URL(base + encode_s3_path(bucket, key), encoded=True)
            return await _aiohttp_read(session, url, None, key)

        yield fetch


@contextlib.asynccontextmanager
async def obstore_client(target: Target) -> AsyncIterator[Fetch]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        target.bucket,
        endpoint=target.endpoint_url,
        access_key_id=target.access_key,
        secret_access_key=target.secret_key,
        region=target.region,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )

    async def fetch(key: str) -> int:
        result = await obstore.get_async(store, key)
        return len(await result.bytes_async())

    yield fetch


def _fetch_path(verify_checksums: bool) -> ClientFactory:
    @contextlib.asynccontextmanager
    async def fetch_path(target: Target) -> AsyncIterator[Fetch]:
        from concurrent_loader.config import FetchConfig
        from concurrent_loader.fetch import FetchClient
        from concurrent_loader.stores import S3Config

        store = S3Config.from_url(
            f"s3://{target.bucket}/",
            endpoint_url=target.endpoint_url,
            region=target.region,
            aws_access_key_id=target.access_key,
            aws_secret_access_key=target.secret_key,
            addressing_style="path",
        )
        if not verify_checksums and "verify_checksums" in S3Config.__dataclass_fields__:
            store = dataclasses.replace(store, verify_checksums=False)
        config = FetchConfig()
        client = FetchClient(store.open(config), config)
        try:

            async def fetch(key: str) -> int:
                return len(await client.get(key))

            yield fetch
        finally:
            await client.close()

    return fetch_path


CLIENTS: dict[str, ClientFactory] = {
    "ours": ours,
    "fetch-path": _fetch_path(verify_checksums=True),
    "fetch-path-unchecked": _fetch_path(verify_checksums=False),
    "aiohttp+ours": aiohttp_ours,
    "aiohttp+botocore": aiohttp_botocore,
    "aiobotocore": aiobotocore,
    "aiohttp-unsigned": aiohttp_unsigned,
    "obstore": obstore_client,
}


def available_clients() -> list[str]:
    names = list(CLIENTS)
    try:
        import obstore  # noqa: F401
    except ImportError:
        names.remove("obstore")
    return names


# -- measuring --------------------------------------------------------------------------


async def run_all(fetch: Fetch, keys: list[str], concurrency: int, size: int) -> None:
    """GET every key with ``concurrency`` workers; check every body's length."""
    queue: Iterator[str] = iter(keys)

    async def worker() -> None:
        for key in queue:
            got = await fetch(key)
            if got != size:
                raise RuntimeError(f"{key}: got {got} bytes, expected {size}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def measure(
    name: str,
    target: Target,
    keys: list[str],
    size: int,
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    server_cpu: Callable[[], float] | None,
) -> Run:
    warmup = keys[: 2 * target.concurrency]

    async def main() -> Run:
        async with CLIENTS[name](target) as fetch:
            await run_all(fetch, warmup, target.concurrency, size)
            gc.collect()
            server_before = server_cpu() if server_cpu else None
            cpu_before = time.process_time()
            wall_before = time.perf_counter()
            await run_all(fetch, keys, target.concurrency, size)
            wall = time.perf_counter() - wall_before
            cpu = time.process_time() - cpu_before
            server = None
            if server_cpu is not None and server_before is not None:
                server = server_cpu() - server_before
            return Run(name, wall, cpu, len(keys), server)

    loop = loop_factory()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def object_keys(prefix: str, size: int, count: int) -> list[str]:
    return [f"{prefix}{size}/{i:06d}.bin" for i in range(count)]


def ensure_objects(client: Any, bucket: str, keys: list[str], size: int) -> int:
    """Create the bucket and upload the keys not already there with ``size`` bytes."""
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        client.create_bucket(Bucket=bucket)
    prefix = os.path.commonprefix(keys)  # noqa: RUF071 - S3 prefixes are plain strings
    present: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        present.update(o["Key"] for o in page.get("Contents", ()) if o["Size"] == size)
    missing = [k for k in keys if k not in present]

    def put(key: str) -> None:
        client.put_object(Bucket=bucket, Key=key, Body=os.urandom(size))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, missing))
    return len(missing)


def summarize(runs: list[Run]) -> list[str]:
    by_client: dict[str, list[Run]] = {}
    for run in runs:
        by_client.setdefault(run.client, []).append(run)
    with_server = any(r.server_cpu_seconds is not None for r in runs)
    header = f"{'client':<18} {'requests/s':>22} {'client CPU ms/GET':>24}"
    if with_server:
        header += f" {'server CPU ms/GET':>18}"
    lines = [header, "-" * len(header)]
    for name, client_runs in by_client.items():
        rates = [r.requests / r.seconds for r in client_runs]
        cpu_ms = [1000 * r.cpu_seconds / r.requests for r in client_runs]
        line = (
            f"{name:<18} {statistics.median(rates):>8.0f} ({min(rates):>5.0f}-{max(rates):<5.0f})"
            f" {statistics.median(cpu_ms):>9.3f} ({min(cpu_ms):.3f}-{max(cpu_ms):.3f})"
        )
        if with_server:
            server_ms = [
                1000 * r.server_cpu_seconds / r.requests
                for r in client_runs
                if r.server_cpu_seconds is not None
            ]
            line += f" {statistics.median(server_ms):>18.3f}" if server_ms else ""
        lines.append(line)
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint-url", help="S3 endpoint; default: start a LocalS3Server")
    parser.add_argument("--bucket", default="get-cpu-bench")
    parser.add_argument("--prefix", default="get-cpu/")
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--size", type=int, default=110_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--client-cpu", type=int, default=0)
    parser.add_argument("--server-cpu", type=int, default=1, help="for the server it starts")
    parser.add_argument("--clients", help=f"comma-separated subset of {','.join(CLIENTS)}")
    parser.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    parser.add_argument("--access-key", default=os.environ.get("AWS_ACCESS_KEY_ID", "any"))
    parser.add_argument("--secret-key", default=os.environ.get("AWS_SECRET_ACCESS_KEY", "any"))
    parser.add_argument("--region", default=os.environ.get("AWS_REGION", "us-east-1"))
    args = parser.parse_args(argv)
    if args.objects < 1 or args.concurrency < 1 or args.repeats < 1 or args.size < 1:
        parser.error("--objects, --size, --concurrency and --repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Pin first, so every thread started later (boto3's, obstore's runtime) inherits it.
    os.sched_setaffinity(0, {args.client_cpu})

    names = available_clients()
    if args.clients:
        wanted = args.clients.split(",")
        unknown = set(wanted) - set(CLIENTS)
        if unknown:
            raise SystemExit(f"unknown clients: {', '.join(sorted(unknown))}")
        names = [n for n in wanted if n in names]

    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    loop_name = "asyncio"
    if not args.no_uvloop:
        try:
            import uvloop

            loop_factory, loop_name = uvloop.new_event_loop, "uvloop"
        except ImportError:
            pass

    with contextlib.ExitStack() as stack:
        server_cpu: Callable[[], float] | None = None
        if args.endpoint_url:
            import boto3

            endpoint, access_key, secret_key, region = (
                args.endpoint_url,
                args.access_key,
                args.secret_key,
                args.region,
            )
            s3 = boto3.client(
                "s3",
                endpoint_url=endpoint,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                region_name=region,
            )
        else:
            from concurrent_loader.testing import LocalS3Server

            server = stack.enter_context(LocalS3Server(cpus={args.server_cpu}))
            endpoint, access_key, secret_key, region = (
                server.endpoint_url,
                server.access_key,
                server.secret_key,
                server.region,
            )
            s3 = server.client()
            server_cpu = server.cpu_seconds

        keys = object_keys(args.prefix, args.size, args.objects)
        uploaded = ensure_objects(s3, args.bucket, keys, args.size)
        target = Target(endpoint, args.bucket, access_key, secret_key, region, args.concurrency)
        print(
            f"# {args.objects} GETs of {args.size} B, concurrency {args.concurrency}, {loop_name},"
            f" client on CPU {args.client_cpu}, Python {sys.version.split()[0]},"
            f" endpoint {endpoint} ({uploaded} objects uploaded)",
            flush=True,
        )
        # One unmeasured pass over every object, so the server's caches are equally warm
        # for every client; then the clients in a rotating order, so none is always first.
        measure(names[0], target, keys, args.size, loop_factory, None)
        runs = []
        for repeat in range(args.repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                runs.append(measure(name, target, keys, args.size, loop_factory, server_cpu))
        for line in summarize(runs):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
