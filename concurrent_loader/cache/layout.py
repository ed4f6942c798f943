"""What a cache directory is made of, and how it is opened without following a link.

A directory is a cache when it holds ``CACHEDIR.TAG`` (the Cache Directory Tagging
convention) naming this cache and its format, made atomically (written aside, hard-linked
into place) only in a new or empty directory: a non-empty directory without it is refused
(:class:`CacheRefused`), so ``cache=`` never takes over a user's directory. Everything
under it is opened relative to directory descriptors with ``O_NOFOLLOW``, so a link in
place of the cache's own files is refused, never followed; only names of the cache's own
patterns are removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["CACHE_ERRORS", "SHARD_NAME", "CacheRefused", "Handles", "has_entry", "in_shard"]
__all__ += ["open_in", "scan_entries", "temp_files", "unlink_entry"]

MARKER = "CACHEDIR.TAG"
FORMAT = 2
_MARKER_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    f"# concurrent-loader node cache, format {FORMAT}: remove it with "
    "`concurrent-loader cache clear`\n"
).encode()
_MARKER_PREFIX = b"# concurrent-loader node cache, format "
# what an entry, its shard directory and a temporary file are named (all the cache writes)
ENTRY_NAME = re.compile(r"[0-9a-f]{32}")
SHARD_NAME = re.compile(r"[0-9a-f]{2}")
TEMP_NAME = re.compile(r"[0-9a-f]{32}\.\d+\.\d+\.\d+")
_MARKER_TEMP = re.compile(r"\.CACHEDIR\.TAG\.\d+")
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW


class CacheRefused(ConfigError):
    """The directory is not a cache this version may use (not empty and not a cache,
    another format, or a link where the cache keeps one of its own files)."""


#: what a failing cache raises: its disk's errors, and a refusal
CACHE_ERRORS: tuple[type[Exception], ...] = (OSError, CacheRefused)


def _refuse(path: str, why: str) -> CacheRefused:
    return CacheRefused(f"{path} {why}")


def open_in(dir_fd: int, name: str, flags: int, where: str, mode: int = 0o644) -> int:
    """``name`` under ``dir_fd``, never through a link; errors name its whole path."""
    try:
        return os.open(name, flags | _NO_FOLLOW, mode, dir_fd=dir_fd)
    except OSError as exc:
        path = os.path.join(where, name)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(dir_fd, name):
            raise _refuse(path, "is a symbolic link: a cache's files are its own") from None
        raise OSError(exc.errno, exc.strerror, path) from None


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def in_shard(entries_fd: int, name: str, where: str, *, create: bool = False) -> Iterator[int]:
    """The shard directory of entry ``name``, open; ``FileNotFoundError`` when it does not
    exist and not ``create``."""
    shard = name[:2]
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(shard, 0o755, dir_fd=entries_fd)
    shard_fd = open_in(entries_fd, shard, _DIRECTORY, os.path.join(where, "entries"))
    try:
        yield shard_fd
    finally:
        os.close(shard_fd)


@dataclass
class Handles:
    """One process's open files of a cache directory, each opened without following a link."""

    root: str
    pid: int
    root_fd: int
    entries_fd: int
    tmp_fd: int
    ledger_fd: int
    locks_fd: int

    @classmethod
    def open(cls, root: str, *, create: bool) -> Handles:
        """Open the cache at ``root``, first marking it when it is new or empty (and
        ``create``)."""
        if create:
            os.makedirs(root, exist_ok=True)
        fds: list[int] = []
        try:
            try:
                fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            except (FileNotFoundError, NotADirectoryError):
                if create:
                    raise
                raise _refuse(root, "is not a cache directory (not a directory)") from None
            check_marker(fds[0], root, create=create)
            for sub in ("entries", "tmp"):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(sub, 0o755, dir_fd=fds[0])
                fds.append(open_in(fds[0], sub, _DIRECTORY, root))
            for name in ("ledger", "locks"):
                fd = open_in(fds[0], name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, root)
                fds.append(fd)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise _refuse(os.path.join(root, name), "is not a regular file")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return cls(root, os.getpid(), *fds)

    def close(self) -> None:
        for fd in (self.locks_fd, self.ledger_fd, self.tmp_fd, self.entries_fd, self.root_fd):
            os.close(fd)

    def replaced(self) -> bool:
        try:
            if _identity(os.stat(self.root)) != _identity(os.fstat(self.root_fd)):
                return True
            own = {"entries": self.entries_fd, "tmp": self.tmp_fd, "ledger": self.ledger_fd}
            for name, fd in own.items():
                held = _identity(os.fstat(fd))
                if _identity(os.stat(name, dir_fd=self.root_fd, follow_symlinks=False)) != held:
                    return True
        except FileNotFoundError:
            return True
        return False


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def check_marker(root_fd: int, root: str, *, create: bool) -> None:
    """That the directory is a cache of this format, marking it first if it is empty and
    ``create``."""
    try:
        fd = open_in(root_fd, MARKER, os.O_RDONLY | os.O_NONBLOCK, root)
    except FileNotFoundError:
        if not create:
            raise _refuse(root, f"is not a cache directory (no {MARKER})") from None
        _mark(root_fd, root)
        return
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    if text == _MARKER_TEXT:
        return
    line = next((x for x in text.splitlines() if x.startswith(_MARKER_PREFIX)), None)
    if line is None:
        raise _refuse(root, f"is another program's cache directory ({MARKER}): not used")
    raise _refuse(
        root,
        f"is a concurrent-loader cache of another format ({line.decode(errors='replace')}); "
        f"this version reads format {FORMAT}: run `concurrent-loader cache clear {root}` "
        "or name another directory",
    )


def _mark(root_fd: int, root: str) -> None:
    names = os.listdir(root_fd)
    if MARKER in names:  # another process marked it (and made its files) since we looked
        check_marker(root_fd, root, create=False)
        return
    if any(not _MARKER_TEMP.fullmatch(n) for n in names):
        raise _refuse(
            root,
            f"is not empty and not a cache directory (no {MARKER}): a cache needs a "
            "directory of its own",
        )
    temp = f".{MARKER}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NO_FOLLOW, 0o644, dir_fd=root_fd)
    try:
        os.write(fd, _MARKER_TEXT)
    finally:
        os.close(fd)
    try:
        # A link never replaces: when another process marked it first, its marker stays.
        os.link(temp, MARKER, src_dir_fd=root_fd, dst_dir_fd=root_fd, follow_symlinks=False)
    except FileExistsError:
        pass
    finally:
        os.unlink(temp, dir_fd=root_fd)
    check_marker(root_fd, root, create=False)


def scan_entries(entries_fd: int, where: str) -> Iterator[tuple[str, int]]:
    with os.scandir(entries_fd) as shards:
        names = [s.name for s in shards if SHARD_NAME.fullmatch(s.name)]
    for shard in names:
        try:
            shard_fd = open_in(entries_fd, shard, _DIRECTORY, os.path.join(where, "entries"))
        except (FileNotFoundError, CacheRefused):
            continue
        try:
            with os.scandir(shard_fd) as found:
                for item in found:
                    if not (ENTRY_NAME.fullmatch(item.name) and item.name.startswith(shard)):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        st = item.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            yield item.name, st.st_size
        finally:
            os.close(shard_fd)


def unlink_entry(entries_fd: int, name: str, where: str) -> bool:
    try:
        with in_shard(entries_fd, name, where) as shard_fd:
            os.unlink(name, dir_fd=shard_fd)
    except FileNotFoundError:
        return False
    return True


def has_entry(entries_fd: int, name: str, where: str) -> bool:
    try:
        with in_shard(entries_fd, name, where) as shard_fd:
            os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def temp_files(tmp_fd: int) -> Iterator[tuple[str, float]]:
    with os.scandir(tmp_fd) as found:
        for item in found:
            if TEMP_NAME.fullmatch(item.name):
                with contextlib.suppress(FileNotFoundError):
                    st = item.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        yield item.name, st.st_mtime
