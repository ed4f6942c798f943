"""A failed write pauses the cache's writes, never for good: once the back-off has passed,
entries are written again (a directory removed under a running job, a full disk). The
writer's clock is the test's: the back-off passes when the test says so."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from concurrent_loader import FetchConfig
from concurrent_loader.cache import CacheConfig, CachedStoreConfig, writer
from concurrent_loader.cache.directory import name_for
from concurrent_loader.testing.memory import MemoryConfig

from ._entries import read_entry
from .conftest import numbered_objects


class Clock:
    """The writer's ``time`` module in these tests: it moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def pass_the_pause(self) -> None:
        self.now += writer.RETRY_FIRST_S


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(writer, "time", clock)
    return clock


def _entry(config: CachedStoreConfig, key: str) -> Path:
    name = name_for(config.url_for(key))
    return Path(config.cache.directory) / "entries" / name[:2] / name


def _cached(config: CachedStoreConfig, key: str) -> bool:
    return read_entry(str(_entry(config, key)), config.url_for(key)) is not None


def test_writes_resume_after_the_directory_was_removed(cache_config, clock, caplog):
    objects = numbered_objects(4)
    config = CachedStoreConfig(MemoryConfig(objects), cache_config)
    first, second, paused, third = sorted(objects)

    async def run() -> None:
        store = config.open(FetchConfig())
        try:
            await store.get(first)
            await store.flush()
            assert _cached(config, first)
            shutil.rmtree(cache_config.directory)  # `rm -rf` of a running job's cache
            await store.get(second)
            await store.flush()  # the write failed: writes pause
            await store.get(paused)
            await store.flush()
            assert not os.path.exists(cache_config.directory)  # nothing tried meanwhile
            clock.pass_the_pause()
            await store.get(third)
            await store.flush()
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="concurrent_loader.cache"):
        asyncio.run(run())
    assert "failed while writing an entry" in caplog.text
    assert _cached(config, third)
    assert not _cached(config, second) and not _cached(config, paused)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (as root; skipped where mounting is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(path: Path) -> None:
    """Write ``path`` until the disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_writes_resume_once_a_full_disk_has_room_again(small_disk, clock, caplog):
    cache = CacheConfig(str(small_disk / "cache"), max_bytes=10**9).resolved()
    objects = numbered_objects(3, size=20_000)
    config = CachedStoreConfig(MemoryConfig(objects), cache)
    first, second, third = sorted(objects)
    filler = small_disk / "filler"

    async def run() -> None:
        store = config.open(FetchConfig())
        try:
            await store.get(first)
            await store.flush()
            _fill(filler)
            await store.get(second)
            await store.flush()  # no space left: writes pause
            filler.unlink()
            clock.pass_the_pause()
            await store.get(third)
            await store.flush()
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="concurrent_loader.cache"):
        asyncio.run(run())
    assert errno.errorcode[errno.ENOSPC] in caplog.text or "No space left" in caplog.text
    assert _cached(config, first) and not _cached(config, second) and _cached(config, third)
