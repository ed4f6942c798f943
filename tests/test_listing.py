"""Listing a root by prefixes in parallel (``delimiter_listing``) against real S3 servers:
the same keys, sizes and order as the sequential listing, at most ``inflight_start`` listings
in flight, failures naming their prefix."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from concurrent_loader import FetchConfig
from concurrent_loader.errors import AccessDenied, BucketNotFound, ConfigError
from concurrent_loader.listing import list_by_prefixes, list_store
from concurrent_loader.runtime import acquire_runtime
from concurrent_loader.stores.base import DelimitedStore, Level, ObjectInfo
from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.testing import MotoS3Server, RcloneS3Server, S3ServerProcess

BUCKET = "listing"


def _tree(files_only: bool) -> dict[str, bytes]:
    """Keys at several depths, odd names, a wide prefix; unless ``files_only`` (a server
    over a file system, where ``a`` and ``a/b`` cannot both be), also a key equal to a
    prefix without its slash, ``//`` and a "directory" marker alone in its prefix."""
    keys = [
        "top.bin",
        "a-b.bin",  # '-' sorts before '/': "a-b.bin" < "a/..."
        "a/b/c/d/e/deep.bin",
        "a/b/x.bin",
        "a/y.bin",
        "odd name+%/ünï/日本.bin",
        "z/last.bin",
    ]
    keys += [f"wide/{i:03d}/k{i % 7}.bin" for i in range(150)]  # more prefixes than slots
    keys += [f"flat/{i:04d}.bin" for i in range(40)]
    if not files_only:
        keys += ["a", "a/b", "x//y.bin", "x/", "marker-only/"]
    return {key: key.encode() * (1 + len(key) % 3) for key in keys}


def _filled(server: S3ServerProcess, root: str, files_only: bool) -> dict[str, bytes]:
    objects = _tree(files_only)
    server.create_bucket(BUCKET)
    client = server.client()
    try:
        for key, data in objects.items():
            client.put_object(Bucket=BUCKET, Key=root + key, Body=data)
    finally:
        client.close()
    return objects


#: the tree uploaded to each server once: its root and objects, by server name
_uploaded: dict[str, tuple[str, dict[str, bytes]]] = {}


def _config(server: S3ServerProcess, root: str, **options: Any) -> S3Config:
    options = {
        "aws_access_key_id": server.access_key,
        "aws_secret_access_key": server.secret_key,
        **options,
    }
    return S3Config.from_url(
        f"s3://{BUCKET}/{root}", endpoint_url=server.endpoint_url, region=server.region, **options
    ).resolved()


def _run(config: S3Config, use: Callable[[Any], Any], fetch: FetchConfig | None = None) -> Any:
    async def main() -> Any:
        store = config.open(fetch or FetchConfig())
        try:
            return await use(store)
        finally:
            await store.close()

    runtime = acquire_runtime()
    try:
        return runtime.run(main())
    finally:
        runtime.release()


def _sequential(config: S3Config) -> list[ObjectInfo]:
    async def listed(store: Any) -> list[ObjectInfo]:
        return [info async for info in store.list()]

    found: list[ObjectInfo] = _run(config, listed)
    return sorted((i for i in found if not i.key.endswith("/")), key=lambda i: i.key)


@pytest.fixture(params=["moto", "rclone"])
def server_and_tree(
    request: pytest.FixtureRequest, aws_env: Callable[..., Any]
) -> tuple[S3ServerProcess, str, dict[str, bytes]]:
    server: S3ServerProcess = request.getfixturevalue(f"{request.param}_server")
    aws_env(server)
    if request.param not in _uploaded:
        files_only = isinstance(server, RcloneS3Server)
        _uploaded[request.param] = ("tree/", _filled(server, "tree/", files_only))
    root, objects = _uploaded[request.param]
    return server, root, objects


@pytest.mark.parametrize("width", [1, 2, 4, 64])
def test_the_same_keys_and_order_as_the_sequential_listing(
    server_and_tree: tuple[S3ServerProcess, str, dict[str, bytes]], width: int
) -> None:
    server, root, objects = server_and_tree
    config = _config(server, root)
    assert config.capabilities.delimiter_listing
    expected = [ObjectInfo(k, len(v)) for k, v in sorted(objects.items()) if not k.endswith("/")]
    assert _sequential(config) == expected
    found: list[ObjectInfo] = []
    # With a first page of 10 keys this root is split by prefixes (a first page is kept only
    # when it is the whole root; otherwise its keys are found again by prefix).
    _run(config, lambda store: list_by_prefixes(store, width, found.append, first_page=10))
    kept = sorted((i for i in found if not i.key.endswith("/")), key=lambda i: i.key)
    assert kept == expected
    assert len(found) == len(set(found))
    # Through list_store (a root this small is its first page), with its progress ticks.
    ticks: list[None] = []
    fetch = FetchConfig(max_inflight_requests=width)
    assert list_store(config, fetch, on_object=lambda: ticks.append(None)) == expected
    assert len(ticks) == len(expected)


class _Counting:
    """A store's ``list_level``, counting the listings in flight at once."""

    def __init__(self, store: DelimitedStore) -> None:
        self.store = store
        self.in_flight = 0
        self.most = 0
        self.calls: list[tuple[str, bool]] = []

    async def list_level(
        self, prefix: str, *, delimited: bool, first_page: int | None = None
    ) -> Level:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.calls.append((prefix, delimited))
        try:
            await asyncio.sleep(0.005)  # let the others start, if the limit allows
            return await self.store.list_level(prefix, delimited=delimited, first_page=first_page)
        finally:
            self.in_flight -= 1


@pytest.mark.parametrize("width", [1, 3, 8])
def test_listings_in_flight_stay_within_the_limit(
    moto_server: MotoS3Server, aws_env: Callable[..., Any], width: int
) -> None:
    aws_env(moto_server)
    if "moto" not in _uploaded:
        _uploaded["moto"] = ("tree/", _filled(moto_server, "tree/", files_only=False))
    root, objects = _uploaded["moto"]
    found: list[ObjectInfo] = []

    async def use(store: Any) -> _Counting:
        counting = _Counting(store)
        await list_by_prefixes(counting, width, found.append, first_page=10)  # type: ignore[arg-type]
        return counting

    counting = _run(_config(moto_server, root), use)
    assert 1 <= counting.most <= width
    if width > 1:
        assert counting.most == width  # the limit is used, not just respected
    assert sorted(info.key for info in found) == sorted(objects)
    # After the first page, each prefix is listed once; once a level has ``width``
    # prefixes, they are listed whole.
    assert counting.calls[0] == ("", False)
    prefixes = [prefix for prefix, _ in counting.calls[1:]]
    assert len(prefixes) == len(set(prefixes))
    whole = [prefix for prefix, delimited in counting.calls[1:] if not delimited]
    assert whole == [] or len(whole) >= width


def test_a_root_within_its_first_page_is_one_request(
    moto_server: MotoS3Server, aws_env: Callable[..., Any]
) -> None:
    aws_env(moto_server)
    if "moto" not in _uploaded:
        _uploaded["moto"] = ("tree/", _filled(moto_server, "tree/", files_only=False))
    root, objects = _uploaded["moto"]
    found: list[ObjectInfo] = []

    async def use(store: Any) -> _Counting:
        counting = _Counting(store)
        await list_by_prefixes(counting, 8, found.append)  # type: ignore[arg-type]
        return counting

    counting = _run(_config(moto_server, root), use)
    assert counting.calls == [("", False)]
    assert sorted(info.key for info in found) == sorted(objects)


def test_a_failed_listing_names_its_prefix(
    moto_server: MotoS3Server, aws_env: Callable[..., Any]
) -> None:
    aws_env(moto_server)
    missing = _config(moto_server, "root/").with_root("s3://no-such-bucket-here/root/")
    with pytest.raises(BucketNotFound) as info:
        _run(missing, lambda store: store.list_level("sub/dir/", delimited=True))
    assert info.value.url == "s3://no-such-bucket-here/root/sub/dir/"
    assert info.value.stage == "list"
    wrong = _config(moto_server, "root/", aws_secret_access_key="wrong-secret")
    with pytest.raises(AccessDenied) as denied:
        list_store(wrong, FetchConfig(max_inflight_requests=4))
    assert denied.value.url == f"s3://{BUCKET}/root/"
    assert "wrong-secret" not in str(denied.value)


def test_an_empty_root_is_an_empty_prefix_error(
    rclone_server: RcloneS3Server, aws_env: Callable[..., Any]
) -> None:
    aws_env(rclone_server)
    rclone_server.create_bucket(BUCKET)
    rclone_server.put_object(BUCKET, "something-else/k.bin", b"elsewhere")
    with pytest.raises(ConfigError, match="no objects under") as info:
        list_store(_config(rclone_server, "nothing-here/"))
    assert info.value.url == f"s3://{BUCKET}/nothing-here/"
