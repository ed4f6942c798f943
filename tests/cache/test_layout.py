"""A cache directory is the cache's own: marked when made, a user's directory refused, only
the cache's own files removed, and no link inside it followed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from concurrent_loader.cache import (
    CacheConfig,
    CacheRefused,
    clear_cache,
    describe_cache,
    layout,
    with_cache,
)
from concurrent_loader.cache.directory import STALE_TEMP_S, CacheDirectory, Ledger, name_for
from concurrent_loader.cache.layout import CorruptEntry, data_checksum, footer
from concurrent_loader.testing.memory import MemoryConfig

from .conftest import numbered_objects

OLD = time.time() - STALE_TEMP_S - 60


def _open(path: Path, budget: int = 100_000) -> CacheDirectory:
    return CacheDirectory(CacheConfig(str(path), max_bytes=budget).resolved())


def _put(directory: CacheDirectory, source: str, data: bytes) -> bool:
    tail = footer(len(data), data_checksum(data), None, source)
    return directory.put(name_for(source), data, tail, replace=False)


def _old_file(path: Path, text: bytes = b"mine") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)
    os.utime(path, (OLD, OLD))
    return path


# ---------------------------------------------------------------------- the marker


def test_a_new_or_empty_directory_is_marked_and_used(tmp_path):
    for path in (tmp_path / "new", tmp_path / "empty"):
        if path.name == "empty":
            path.mkdir()
        memory = MemoryConfig(numbered_objects(1))
        assert with_cache(memory, str(path)) is not memory
        assert (path / "CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f597d28d17")
        _open(path).close()  # marked: opened again without complaint


def test_a_directory_another_process_made_a_cache_meanwhile_is_used(tmp_path, monkeypatch):
    # This process found no marker; another one marks the directory and makes the cache's
    # files in it before this one looks at what the directory holds (processes of a node
    # starting at once on a new directory).
    cache = tmp_path / "cache"
    real_mark = layout._mark

    def another_process_first(root_fd: int, root: str) -> None:
        monkeypatch.setattr(layout, "_mark", real_mark)
        _open(cache).close()
        real_mark(root_fd, root)

    monkeypatch.setattr(layout, "_mark", another_process_first)
    _open(cache).close()
    assert layout._mark is real_mark  # the other process did come first


def test_a_users_directory_is_refused_and_left_as_it_was(tmp_path):
    home = tmp_path / "home"
    mine = [
        _old_file(home / "notes.txt"),
        _old_file(home / "tmp" / "draft.txt"),
        _old_file(home / "entries" / "photo.jpg"),
    ]
    with pytest.raises(CacheRefused, match=f"{home} is not empty and not a cache directory"):
        with_cache(MemoryConfig(numbered_objects(1)), str(home))
    with pytest.raises(CacheRefused, match="not a cache directory"):
        clear_cache(str(home))
    assert all(path.read_bytes() == b"mine" for path in mine)
    assert sorted(p.name for p in home.iterdir()) == ["entries", "notes.txt", "tmp"]


def test_info_and_clear_of_a_missing_directory_or_a_file_say_it_is_not_a_cache(tmp_path):
    (tmp_path / "file").write_bytes(b"mine")
    for path in (tmp_path / "missing", tmp_path / "file"):
        for call in (describe_cache, clear_cache):
            with pytest.raises(CacheRefused, match=f"{path} is not a cache directory"):
                call(str(path))
    assert (tmp_path / "file").read_bytes() == b"mine"


def test_a_cache_file_that_cannot_be_opened_is_named_by_its_whole_path(tmp_path):
    cache = tmp_path / "cache"
    _open(cache).close()
    (cache / "ledger").unlink()
    (cache / "ledger").mkdir()
    with pytest.raises(IsADirectoryError, match=f"{cache}/ledger"):
        describe_cache(str(cache))
    (cache / "tmp").rmdir()
    (cache / "tmp").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=f"{cache}/tmp"):
        clear_cache(str(cache))


def test_a_directory_holding_only_a_tmp_of_the_users_is_refused(tmp_path):
    # The cache's own subdirectory names are no proof that a directory is a cache.
    home = tmp_path / "home"
    draft = _old_file(home / "tmp" / f"{'a' * 32}.1.1.1")
    with pytest.raises(CacheRefused, match=str(home)):
        _open(home)
    with pytest.raises(CacheRefused, match=str(home)):
        clear_cache(str(home))
    assert draft.exists()


def test_clear_removes_only_what_the_cache_wrote(tmp_path):
    cache = tmp_path / "cache"
    directory = _open(cache)
    try:
        assert _put(directory, "s3://b/k", b"x" * 100)
    finally:
        directory.close()
    name = name_for("s3://b/k")
    temp = _old_file(cache / "tmp" / f"{name}.1.2.3", b"half")
    kept = [
        _old_file(cache / "tmp" / "notes.txt"),
        _old_file(cache / "entries" / "readme"),
        _old_file(cache / "entries" / name[:2] / "photo.jpg"),
        _old_file(cache / "mine.txt"),
    ]
    assert clear_cache(str(cache)) == 1
    assert not (cache / "entries" / name[:2] / name).exists() and not temp.exists()
    assert all(path.read_bytes() == b"mine" for path in kept)


def test_another_format_is_refused(tmp_path):
    cache = tmp_path / "cache"
    _open(cache).close()
    marker = cache / "CACHEDIR.TAG"
    marker.write_bytes(marker.read_bytes().replace(b"format 2", b"format 9"))
    with pytest.raises(CacheRefused, match="format 9"):
        _open(cache)


# ---------------------------------------------------------------------- links


def test_a_ledger_linked_to_a_users_file_is_refused_and_the_file_untouched(tmp_path):
    cache, precious = tmp_path / "cache", tmp_path / "precious.bin"
    _open(cache).close()
    precious.write_bytes(b"P" * 100)
    (cache / "ledger").unlink()
    (cache / "ledger").symlink_to(precious)
    with pytest.raises(CacheRefused, match=f"{cache}/ledger is a symbolic link"):
        _open(cache)
    with pytest.raises(CacheRefused, match="symbolic link"):
        clear_cache(str(cache))
    assert precious.read_bytes() == b"P" * 100
    assert Ledger.unpack(precious.read_bytes()[: len(Ledger().pack())]) is None


def test_a_tmp_linked_elsewhere_is_refused_and_its_files_kept(tmp_path):
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    _open(cache).close()
    old = [_old_file(elsewhere / f"{'a' * 32}.1.1.1"), _old_file(elsewhere / "notes.txt")]
    (cache / "tmp").rmdir()
    (cache / "tmp").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CacheRefused, match=f"{cache}/tmp is a symbolic link"):
        _open(cache)
    with pytest.raises(CacheRefused, match="symbolic link"):
        clear_cache(str(cache))
    assert all(path.exists() for path in old)


def test_an_entries_link_is_refused_and_clear_removes_nothing_through_it(tmp_path):
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    directory = _open(cache)
    try:
        assert _put(directory, "s3://b/k", b"x" * 100)
    finally:
        directory.close()
    (cache / "entries").rename(elsewhere)
    (cache / "entries").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CacheRefused, match=f"{cache}/entries is a symbolic link"):
        clear_cache(str(cache))
    with pytest.raises(CacheRefused, match="symbolic link"):
        with_cache(MemoryConfig(numbered_objects(1)), str(cache))
    name = name_for("s3://b/k")
    assert (elsewhere / name[:2] / name).exists()


def test_an_entry_that_is_a_link_is_not_served_and_is_replaced_not_followed(tmp_path):
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    name = name_for("s3://b/k")
    target = outside / name
    directory = _open(cache)
    try:
        assert _put(directory, "s3://b/k", b"k" * 100)
        entry = cache / "entries" / name[:2] / name
        entry.rename(target)  # an intact entry, reached only through a link
        entry.symlink_to(target)
        with pytest.raises(CorruptEntry, match="symbolic link"):
            directory.read(name, "s3://b/k")
        data = b"n" * 100
        assert directory.put(
            name, data, footer(100, data_checksum(data), None, "s3://b/k"), replace=True
        )
        assert not entry.is_symlink()
        read = directory.read(name, "s3://b/k")
        assert read is not None and read.data == data
    finally:
        directory.close()
    assert target.read_bytes()[:100] == b"k" * 100


def test_a_shard_that_is_a_link_is_neither_read_nor_written(tmp_path):
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    name = name_for("s3://b/k")
    directory = _open(cache)
    try:
        assert _put(directory, "s3://b/k", b"k" * 100)
        shard = cache / "entries" / name[:2]
        shard.rename(outside)
        shard.symlink_to(outside, target_is_directory=True)
        with pytest.raises(CacheRefused, match="symbolic link"):
            directory.read(name, "s3://b/k")
        data = b"n" * 100
        with pytest.raises(CacheRefused, match=f"{shard} is a symbolic link"):
            directory.put(
                name, data, footer(100, data_checksum(data), None, "s3://b/k"), replace=True
            )
    finally:
        directory.close()
    assert clear_cache(str(cache)) == 0
    assert [p.name for p in outside.iterdir()] == [name]
