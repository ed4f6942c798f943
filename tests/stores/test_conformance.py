"""One contract, every store: each check runs against every case of ``conftest.py`` (memory,
local directory, S3 on SeaweedFS and on moto, plain HTTP, the node cache and read-ahead
wrappers). Where backends differ by design, the case says how (``Case``) and the check
holds each to what it says; a check a backend cannot take is skipped with the capability
that rules it out."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from concurrent_loader import FetchConfig
from concurrent_loader.errors import (
    ConfigError,
    FetchError,
    ObjectNotFound,
    ObjectTooLarge,
    Reason,
)
from concurrent_loader.stores import ByteRange, Store

from .conftest import OBJECTS, Case

T = TypeVar("T")

SMALL = OBJECTS["small.bin"]
BIG = OBJECTS["nested/dir/big.bin"]


def with_store(case: Case, use: Callable[[Any], Awaitable[T]], **fetch: Any) -> T:
    """``use(store)`` on a store of ``case`` opened on a fresh loop, then closed."""

    async def run() -> T:
        store = case.config.open(FetchConfig(**fetch))
        try:
            return await use(store)
        finally:
            await store.close()

    return asyncio.run(run())


async def _read(store: Any, key: str, byte_range: ByteRange | None = None) -> bytes:
    return bytes((await store.get(key, byte_range)).data)


def test_an_open_store_is_a_store_with_its_configs_capabilities_and_names(case: Case) -> None:
    async def use(store: Any) -> None:
        assert isinstance(store, Store)
        assert store.capabilities == case.config.capabilities
        for key in OBJECTS:
            assert store.url_for(key) == case.config.url_for(key)
            assert store.url_for(key).endswith(key)

    with_store(case, use)


def test_the_config_is_picklable_and_hashable(case: Case) -> None:
    copy = pickle.loads(pickle.dumps(case.config))
    assert copy.url_for("small.bin") == case.config.url_for("small.bin")
    hash(case.config)


def test_get_returns_each_whole_object(case: Case) -> None:
    async def use(store: Any) -> dict[str, bytes]:
        return {key: await _read(store, key) for key in OBJECTS}

    assert with_store(case, use) == OBJECTS


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, 1),  # the first byte
        (10, 20),
        (999, 1000),  # the last byte
        (0, 1000),  # the whole object, as a range
        (500, 1000),  # from an offset to the end (what an open-ended range asks)
        (1000 - 37, 1000),  # the last 37 bytes (what a suffix range asks)
    ],
)
def test_a_range_is_exactly_those_bytes(case: Case, start: int, end: int) -> None:
    if not case.config.capabilities.ranges:
        pytest.skip("capabilities.ranges is False: the store reads whole objects only")
    got = with_store(case, lambda store: _read(store, "small.bin", ByteRange(start, end)))
    assert got == SMALL[start:end]


def test_ranges_across_a_large_object(case: Case) -> None:
    if not case.config.capabilities.ranges:
        pytest.skip("capabilities.ranges is False: the store reads whole objects only")
    ranges = [ByteRange(s, min(s + 7919, len(BIG))) for s in range(0, len(BIG), 7919)]

    async def use(store: Any) -> list[bytes]:
        return [await _read(store, "nested/dir/big.bin", r) for r in ranges]

    assert with_store(case, use) == [BIG[r.start : r.end] for r in ranges]


def test_an_empty_range_cannot_be_asked_for() -> None:
    """``ByteRange`` is ``[start, end)`` with ``start < end``: no store sees an empty one
    (nor an open-ended or suffix form: the caller knows the size and asks for the bytes)."""
    for start, end in [(5, 5), (6, 5), (-1, 3)]:
        with pytest.raises(ValueError, match="invalid byte range"):
            ByteRange(start, end)


@pytest.mark.parametrize(("start", "end"), [(990, 1010), (1010, 1020)])
def test_a_range_past_the_end_is_short_or_an_error_as_the_store_defines(
    case: Case, start: int, end: int
) -> None:
    def read() -> bytes:
        return with_store(case, lambda store: _read(store, "small.bin", ByteRange(start, end)))

    if case.past_end == "short":
        assert read() == SMALL[start:end]
    else:
        with pytest.raises(FetchError) as caught:
            read()
        assert caught.value.url == case.config.url_for("small.bin")


@pytest.mark.parametrize("key", ["missing.bin", "nested/dir", "nested/missing/x.bin"])
def test_a_missing_key_is_object_not_found_naming_the_object(case: Case, key: str) -> None:
    for byte_range in (None, ByteRange(0, 1)):
        with pytest.raises(ObjectNotFound) as caught:
            with_store(case, lambda store, r=byte_range: store.get(key, r))
        assert caught.value.url == case.config.url_for(key)
        assert key in str(caught.value)
        assert caught.value.stage == "fetch"
        assert caught.value.cause is Reason.NOT_FOUND


def test_an_object_over_max_object_bytes_is_object_too_large(case: Case) -> None:
    with pytest.raises(ObjectTooLarge) as caught:
        with_store(case, lambda store: store.get("small.bin"), max_object_bytes=100)
    assert caught.value.url == case.config.url_for("small.bin")
    assert caught.value.cause is Reason.OBJECT_TOO_LARGE


def test_a_range_within_max_object_bytes_of_a_larger_object_is_read(case: Case) -> None:
    if case.ranges_limited_by_span:
        # A read-ahead store reads the span around a range: the span is what is limited.
        with pytest.raises(ObjectTooLarge):
            with_store(
                case,
                lambda store: store.get("small.bin", ByteRange(0, 50)),
                max_object_bytes=100,
            )
        return
    got = with_store(
        case, lambda store: _read(store, "small.bin", ByteRange(0, 50)), max_object_bytes=100
    )
    assert got == SMALL[:50]


def test_listing_gives_every_object_with_its_size(case: Case) -> None:
    if not case.config.capabilities.listing:
        pytest.skip("capabilities.listing is False: keys come from the caller (plain HTTP)")

    async def use(store: Any) -> list[tuple[str, int]]:
        return sorted([(info.key, info.size) async for info in store.list()])

    assert with_store(case, use) == sorted((key, len(data)) for key, data in OBJECTS.items())


def test_a_store_that_cannot_list_says_so_with_a_config_error(case: Case) -> None:
    if case.config.capabilities.listing:
        pytest.skip("capabilities.listing is True: covered by the listing check")

    async def use(store: Any) -> None:
        async for _ in store.list():
            pass

    with pytest.raises(ConfigError) as caught:
        with_store(case, use)
    assert caught.value.url == case.config.url_for("")


def test_many_gets_at_once_each_get_their_own_bytes(case: Case) -> None:
    reads: list[tuple[str, ByteRange | None]] = []
    for i in range(64):
        if i % 3 == 0:
            reads.append((list(OBJECTS)[i % len(OBJECTS)], None))
        else:
            start = (i * 3001) % (len(BIG) - 5000)
            reads.append(("nested/dir/big.bin", ByteRange(start, start + 1 + i * 37)))

    async def use(store: Any) -> list[bytes]:
        return list(await asyncio.gather(*(_read(store, key, r) for key, r in reads)))

    expected = [OBJECTS[key] if r is None else OBJECTS[key][r.start : r.end] for key, r in reads]
    assert with_store(case, use) == expected


def test_a_failed_get_among_many_leaves_the_others_whole(case: Case) -> None:
    keys = ["small.bin", "missing.bin", "nested/dir/big.bin", "missing.bin", "empty.bin"]

    async def use(store: Any) -> list[Any]:
        return list(
            await asyncio.gather(*(_read(store, key) for key in keys), return_exceptions=True)
        )

    got = with_store(case, use)
    for key, result in zip(keys, got, strict=True):
        if key in OBJECTS:
            assert result == OBJECTS[key]
        else:
            assert isinstance(result, ObjectNotFound)


def test_reads_without_a_loop_match_when_the_store_is_not_remote(case: Case) -> None:
    if case.config.capabilities.remote:
        pytest.skip("capabilities.remote is True: reads go through the loop only")
    store = case.config.open(FetchConfig())
    try:
        assert bytes(store.get_blocking("small.bin")) == SMALL
        assert bytes(store.get_blocking("small.bin", ByteRange(3, 9))) == SMALL[3:9]
        with pytest.raises(ObjectNotFound):
            store.get_blocking("missing.bin")
        if case.config.capabilities.listing:
            listed = sorted((info.key, info.size) for info in store.list_blocking())
            assert listed == sorted((key, len(data)) for key, data in OBJECTS.items())
    finally:
        asyncio.run(store.close())


def test_close_is_idempotent_and_a_get_after_it_is_as_the_store_defines(case: Case) -> None:
    async def run() -> None:
        store = case.config.open(FetchConfig())
        assert await _read(store, "small.bin") == SMALL
        await store.close()
        await store.close()
        if case.after_close == "works":
            assert await _read(store, "small.bin") == SMALL
        else:
            with pytest.raises(RuntimeError):
                await store.get("small.bin")

    asyncio.run(run())


def test_a_store_opened_again_after_another_closed_reads_the_same(case: Case) -> None:
    first = with_store(case, lambda store: _read(store, "small.bin"))
    assert with_store(case, lambda store: _read(store, "small.bin")) == first == SMALL
