"""The shared directory: the budget, the ledger, crashes and clearing.

Cross-process tests fork real processes writing into one directory on the real filesystem.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from concurrent_loader.cache import CacheConfig, clear_cache, describe_cache
from concurrent_loader.cache.directory import (
    STALE_TEMP_S,
    CacheDirectory,
    Ledger,
    entry_path,
    name_for,
)
from concurrent_loader.cache.layout import data_checksum, footer

from ._entries import read_entry


def _put(directory: CacheDirectory, source: str, data: bytes, *, replace: bool = False) -> bool:
    tail = footer(len(data), data_checksum(data), None, source)
    return directory.put(name_for(source), data, tail, replace=replace)


def _entry_size(source: str, data: bytes) -> int:
    return len(data) + len(footer(len(data), 0, None, source))


def _open(path: Path, budget: int) -> CacheDirectory:
    path.mkdir(exist_ok=True)
    return CacheDirectory(CacheConfig(str(path), max_bytes=budget).resolved())


def _scanned_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "entries").rglob("*") if f.is_file())


def test_fill_adds_until_the_budget_then_refuses(cache_dir):
    size = _entry_size("s3://b/00", b"x" * 1000)
    directory = _open(cache_dir, budget=3 * size + size // 2)
    try:
        added = [_put(directory, f"s3://b/{i:02d}", b"x" * 1000) for i in range(6)]
        assert added == [True, True, True, False, False, False]
        info = describe_cache(str(cache_dir))
        assert info["entries"] == 3 and info["bytes"] == info["ledger_bytes"] == 3 * size
        # what is in never goes: the first entries still read back
        assert (
            read_entry(entry_path(directory.root, name_for("s3://b/00")), "s3://b/00") is not None
        )
    finally:
        directory.close()


def test_replacing_a_bad_entry_keeps_the_ledger_exact(cache_dir):
    directory = _open(cache_dir, budget=10_000)
    try:
        assert _put(directory, "s3://b/k", b"a" * 500)
        assert _put(directory, "s3://b/k", b"b" * 700, replace=True)
        info = describe_cache(str(cache_dir))
        assert info["entries"] == 1 and info["ledger_bytes"] == info["bytes"]
    finally:
        directory.close()


def test_a_bad_entry_that_no_longer_fits_is_removed_anyway(cache_dir):
    directory = _open(cache_dir, budget=_entry_size("s3://b/k", b"a" * 500))
    try:
        assert _put(directory, "s3://b/k", b"a" * 500)
        assert not _put(directory, "s3://b/k", b"b" * 900, replace=True)
        assert not os.path.exists(entry_path(directory.root, name_for("s3://b/k")))
        assert describe_cache(str(cache_dir))["ledger_bytes"] == 0
    finally:
        directory.close()


def test_a_lost_ledger_is_rebuilt_from_the_entries(cache_dir):
    directory = _open(cache_dir, budget=10_000)
    try:
        _put(directory, "s3://b/1", b"a" * 100)
        _put(directory, "s3://b/2", b"b" * 200)
        (cache_dir / "ledger").write_bytes(b"garbage")
        _put(directory, "s3://b/3", b"c" * 300)
        assert describe_cache(str(cache_dir))["ledger_bytes"] == _scanned_bytes(cache_dir)
    finally:
        directory.close()


def test_stale_temporary_files_go_when_a_process_opens_the_cache(cache_dir):
    _open(cache_dir, budget=1000).close()
    tmp = cache_dir / "tmp"
    stale, fresh = tmp / f"{'a' * 32}.1.1.1", tmp / f"{'b' * 32}.2.2.2"
    foreign = tmp / "notes.txt"  # not a name the cache writes: never removed
    for path in (stale, fresh, foreign):
        path.write_bytes(b"half")
    old = time.time() - STALE_TEMP_S - 1
    os.utime(stale, (old, old))
    os.utime(foreign, (old, old))
    _open(cache_dir, budget=1000).close()
    assert not stale.exists() and fresh.exists() and foreign.exists()


def test_clear_removes_entries_and_temporary_files_only_in_a_cache(cache_dir, tmp_path):
    directory = _open(cache_dir, budget=10_000)
    try:
        _put(directory, "s3://b/1", b"a" * 100)
        directory.record_reads(3, 1, 300)
    finally:
        directory.close()
    dead = cache_dir / "tmp" / f"{'c' * 32}.1.1.1"
    dead.write_bytes(b"1")
    os.utime(dead, (time.time() - STALE_TEMP_S - 1,) * 2)
    info = describe_cache(str(cache_dir))
    assert (info["hits"], info["misses"], info["hit_rate"]) == (3, 1, 0.75)
    assert clear_cache(str(cache_dir)) == 1
    info = describe_cache(str(cache_dir))
    assert info["entries"] == info["bytes"] == info["temporary_files"] == info["hits"] == 0
    with pytest.raises(ValueError, match="not a cache directory"):
        clear_cache(str(tmp_path))


def _fill_from_another_process(path: str, budget: int, worker: int, count: int) -> None:
    directory = CacheDirectory(CacheConfig(path, max_bytes=budget).resolved())
    try:
        for i in range(count):
            _put(directory, f"s3://b/{worker}/{i}", bytes([worker]) * (200 + 37 * i))
    finally:
        directory.close()


def test_the_budget_holds_across_processes(cache_dir):
    budget = 40_000
    _open(cache_dir, budget).close()
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_fill_from_another_process, args=(str(cache_dir), budget, w, 60))
        for w in range(4)
    ]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    on_disk = _scanned_bytes(cache_dir)
    info = describe_cache(str(cache_dir))
    # 4 x 60 entries of ~1.3 KB would be ~5 x the budget
    assert on_disk <= budget
    assert info["ledger_bytes"] == on_disk
    assert on_disk > budget * 0.85


def test_a_ledger_is_a_fixed_record():
    ledger = Ledger(1, 2, 3, 4, 5)
    assert Ledger.unpack(ledger.pack()) == ledger
    assert Ledger.unpack(b"short") is None
