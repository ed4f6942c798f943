"""The in-memory store: a real Store whose latency, failures and stalls follow a script."""

from __future__ import annotations

import asyncio

import pytest

from concurrent_loader.config import FetchConfig
from concurrent_loader.errors import ObjectNotFound, Reason, ServerError
from concurrent_loader.stores import ByteRange, Store
from concurrent_loader.testing.memory import STALL, MemoryConfig


def _open(config: MemoryConfig, **fetch: int) -> Store:
    return config.open(FetchConfig(**fetch))


def test_get_returns_the_object_or_a_range_of_it():
    config = MemoryConfig({"a": b"0123456789"})
    store = _open(config)
    assert isinstance(store, Store)

    async def main() -> tuple[bytes, bytes]:
        whole = await store.get("a")
        part = await store.get("a", ByteRange(2, 5))
        return bytes(whole.data), bytes(part.data)

    assert asyncio.run(main()) == (b"0123456789", b"234")
    assert config.stats.gets == {"a": 2}


def test_names_objects_under_its_name():
    config = MemoryConfig({}, name="bucket")
    assert config.url_for("dir/x.bin") == "memory://bucket/dir/x.bin"
    assert _open(config).url_for("x") == "memory://bucket/x"


def test_script_decides_each_attempt_counting_from_zero_per_key():
    asked: list[tuple[str, int]] = []

    def script(key: str, attempt: int) -> object:
        asked.append((key, attempt))
        if key == "a" and attempt == 0:
            return ServerError("boom", url="memory://test/a", cause=Reason.SERVER_ERROR)
        return None

    store = _open(MemoryConfig({"a": b"A", "b": b"B"}, script=script))

    async def main() -> list[bytes]:
        with pytest.raises(ServerError):
            await store.get("a")
        return [bytes((await store.get(k)).data) for k in ("a", "b", "a")]

    assert asyncio.run(main()) == [b"A", b"B", b"A"]
    assert asked == [("a", 0), ("a", 1), ("b", 0), ("a", 2)]


def test_scripted_latency_is_reported_as_time_to_first_byte():
    store = _open(MemoryConfig({"a": b"A"}, latency_s=0.002, script=lambda k, a: 0.003))
    body = asyncio.run(store.get("a"))
    assert body.first_byte_s == pytest.approx(0.005)


def test_concurrency_is_recorded():
    config = MemoryConfig({f"{i}": b"x" for i in range(5)}, latency_s=0.005)
    store = _open(config)

    async def main() -> None:
        await asyncio.gather(*(store.get(f"{i}") for i in range(5)))

    asyncio.run(main())
    assert config.stats.max_in_flight == 5
    assert config.stats.in_flight == 0
    assert config.stats.total == 5


def test_stalled_get_answers_only_by_cancellation():
    asked = asyncio.Event()

    def script(key: str, attempt: int) -> object:
        asked.set()
        return STALL

    config = MemoryConfig({"a": b"A"}, script=script)

    async def main() -> None:
        task = asyncio.create_task(_open(config).get("a"))
        await asked.wait()
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done()
        assert config.stats.in_flight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert config.stats.in_flight == 0

    asyncio.run(main())


def test_every_store_of_one_config_shares_its_stats():
    config = MemoryConfig({"a": b"A"})
    asyncio.run(_open(config).get("a"))
    asyncio.run(_open(config).get("a"))
    assert config.stats.gets["a"] == 2


@pytest.mark.parametrize("remote", [True, False])
def test_capabilities_follow_remote(remote: bool):
    config = MemoryConfig({}, remote=remote)
    assert config.capabilities.remote is remote
    assert config.capabilities.listing and config.capabilities.ranges
    assert _open(config).capabilities == config.capabilities


def test_blocking_reads_count_as_gets():
    config = MemoryConfig({"a": b"0123"}, remote=False)
    store = _open(config)
    assert store.get_blocking("a") == b"0123"
    assert store.get_blocking("a", ByteRange(1, 3)) == b"12"
    with pytest.raises(ObjectNotFound):
        store.get_blocking("b")
    assert config.stats.gets == {"a": 2, "b": 1}


def test_blocking_reads_follow_the_script():
    def script(key: str, attempt: int) -> object:
        return ServerError("boom", url="memory://test/a", cause=Reason.SERVER_ERROR)

    store = _open(MemoryConfig({"a": b"A"}, remote=False, script=script))
    with pytest.raises(ServerError):
        store.get_blocking("a")


def test_byte_range_length():
    assert ByteRange(2, 7).length == 5
