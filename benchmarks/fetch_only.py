"""Raw GET throughput and client CPU per GET, without decode.

For one client and each concurrency ``c``: open a client sized for ``c`` connections, warm
it up with ``c`` GETs (connections open, credentials resolved), then time exactly
``requests`` GETs with ``c`` in flight and read this process's CPU time (all threads,
including a Rust runtime's) around the same window. Every GET's body is read whole.

Clients: ``ours`` (:class:`concurrent_loader.fetch.FetchClient` over the S3 store), ``aiobotocore``
(``get_object`` on one client), ``boto3-threads`` (one client shared by ``c`` threads, as
boto3 documents for multithreading) and ``obstore`` (``get_async`` + ``bytes_async``).
The asyncio clients all run on the event loop the loader itself uses (uvloop when it is
installed), so the loop is not what differs between them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import resource
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CLIENTS = ("ours", "aiobotocore", "boto3-threads", "obstore")


def unavailable_reason(client: str) -> str | None:
    """Why ``client`` cannot run in this environment, or None when it can."""
    if client == "ours":
        try:
            from concurrent_loader.fetch import FetchClient  # noqa: F401
        except ImportError as exc:
            return f"concurrent_loader.fetch.FetchClient does not import: {exc}"
        return None
    module = {"aiobotocore": "aiobotocore", "boto3-threads": "boto3", "obstore": "obstore"}
    if client not in module:
        return f"unknown client {client!r}"
    if importlib.util.find_spec(module[client]) is None:
        return f"{module[client]} is not installed"
    return None


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Window:
    """Wall and CPU time around one measured batch of GETs."""

    def __enter__(self) -> _Window:
        self.cpu0 = _cpu_seconds()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.cpu = _cpu_seconds() - self.cpu0


async def _drive(get: Callable[[str], Awaitable[int]], keys: Iterator[str], n: int, c: int) -> int:
    """Run ``n`` GETs from ``keys`` with ``c`` in flight; return the bytes read."""
    remaining = itertools.repeat(None, n)
    total = 0

    async def lane() -> None:
        nonlocal total
        # next() on shared iterators is safe: lanes only switch at an await.
        for _ in remaining:
            total += await get(next(keys))

    await asyncio.gather(*(lane() for _ in range(min(c, n))))
    return total


async def _async_client(client: str, spec: dict[str, Any], c: int) -> tuple[Any, Any]:
    """(get coroutine function returning the body length, async closer)."""
    bucket, endpoint, region = spec["bucket"], spec["endpoint_url"], spec["region"]
    if client == "ours":
        from concurrent_loader.config import FetchConfig
        from concurrent_loader.fetch import FetchClient
        from concurrent_loader.stores import S3Config

        config = FetchConfig(max_inflight_requests=c)
        store = S3Config(bucket, endpoint_url=endpoint, region=region)
        client = FetchClient(store.open(config), config)

        async def get_ours(key: str) -> int:
            return len(await client.get(key))

        return get_ours, client.close
    if client == "aiobotocore":
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        context = get_session().create_client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            config=AioConfig(max_pool_connections=c, s3={"addressing_style": "path"}),
        )
        s3 = await context.__aenter__()

        async def get_aiobotocore(key: str) -> int:
            response = await s3.get_object(Bucket=bucket, Key=key)
            async with response["Body"] as stream:
                return len(await stream.read())

        async def close_aiobotocore() -> None:
            await context.__aexit__(None, None, None)

        return get_aiobotocore, close_aiobotocore
    if client == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            bucket,
            endpoint=endpoint,
            region=region,
            access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
            secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
            virtual_hosted_style_request=False,
            client_options={"allow_http": True, "pool_max_idle_per_host": str(max(c, 1))},
        )

        async def get_obstore(key: str) -> int:
            result = await obstore.get_async(store, key)
            return len(await result.bytes_async())

        async def close_obstore() -> None:
            return None

        return get_obstore, close_obstore
    raise ValueError(f"{client!r} is not an asyncio client")


async def _measure_async(client: str, spec: dict[str, Any], c: int, n: int) -> dict[str, Any]:
    keys = itertools.cycle(spec["keys"])
    get, close = await _async_client(client, spec, c)
    try:
        await _drive(get, keys, c, c)  # warm-up: open the connections
        with _Window() as window:
            total = await _drive(get, keys, n, c)
    finally:
        await close()
    return _result(n, total, window)


def _measure_boto3_threads(spec: dict[str, Any], c: int, n: int) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=spec["endpoint_url"],
        region_name=spec["region"],
        config=Config(max_pool_connections=c, s3={"addressing_style": "path"}),
    )
    bucket = spec["bucket"]
    keys = itertools.cycle(spec["keys"])
    lock = threading.Lock()

    def run(count: int) -> int:
        todo = iter(range(count))
        total = 0

        def lane() -> int:
            got = 0
            while True:
                with lock:
                    if next(todo, None) is None:
                        return got
                    key = next(keys)
                got += len(s3.get_object(Bucket=bucket, Key=key)["Body"].read())

        with ThreadPoolExecutor(max_workers=c) as pool:
            for got in pool.map(lambda _: lane(), range(min(c, count))):
                total += got
        return total

    try:
        run(c)
        with _Window() as window:
            total = run(n)
    finally:
        s3.close()
    return _result(n, total, window)


def _result(n: int, total_bytes: int, window: _Window) -> dict[str, Any]:
    return {
        "requests": n,
        "bytes": total_bytes,
        "seconds": window.seconds,
        "requests_per_s": n / window.seconds,
        "mb_per_s": total_bytes / window.seconds / 1e6,
        "cpu_s": window.cpu,
        "cpu_ms_per_get": window.cpu / n * 1000,
    }


def requests_for(concurrency: int, rounds: int, min_requests: int) -> int:
    """GETs to time at ``concurrency``: enough rounds that ramp-up and drain are small."""
    return max(concurrency * rounds, min_requests)


def _loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    try:
        import uvloop
    except ImportError:
        return None, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def run_fetch(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one client at every concurrency in ``spec``; called in a fresh subprocess."""
    client: str = spec["client"]
    results: dict[str, Any] = {}
    factory, loop_name = _loop_factory()
    for c in spec["concurrency"]:
        n = requests_for(c, spec["rounds"], spec["min_requests"])
        if client == "boto3-threads":
            results[str(c)] = _measure_boto3_threads(spec, c, n)
        else:
            with asyncio.Runner(loop_factory=factory) as runner:
                results[str(c)] = runner.run(_measure_async(client, spec, c, n))
    return {
        "client": client,
        "event_loop": None if client == "boto3-threads" else loop_name,
        "by_concurrency": results,
    }
