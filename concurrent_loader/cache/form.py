"""What form an entry keeps: the object's bytes as fetched, or a transform of them.

A cache given a transform (``CacheConfig(presize=...)``, such as ``Presize``) keeps, and
returns on a miss, ``transform.apply(original)``, so every read gets the same form:

- an entry's source (hashed into its name and checked when read, :mod:`.entry`) starts with
  ``<identity> ``, so an entry of one setting (or of the original) is never served under
  another; settings may share a directory and its budget;
- ``DIR/forms`` records every setting that read through the directory, for ``cache info``;
  it is never consulted to serve a read;
- ``apply`` runs off the event loop; what it raises fails that read as a ``DecodeError``
  naming the object, and the object is not cached;
- a ranged read with a transform set bypasses the cache: it gets the original's range.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import multiprocessing
import os
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from ..errors import ConfigError, DecodeError, Reason
from ..stores.base import Body
from .layout import Handles, open_in

__all__ = ["Apply", "Transform", "apply_in_pool", "apply_in_thread", "check_transform"]
__all__ += ["clear_forms", "form_tag", "process_pool", "read_forms", "record_form"]
__all__ += ["transformed"]

FORMS_FILE = "forms"
#: the label of a cache without a transform
ORIGINAL = "original"
#: the longest identity a transform may have
MAX_IDENTITY = 512


@runtime_checkable
class Transform(Protocol):
    """What a cache keeps instead of an object's bytes: picklable, and equal settings have
    equal ``identity`` (a stable name: the same identity must always give the same bytes)."""

    @property
    def identity(self) -> str: ...

    def apply(self, data: bytes | bytearray, url: str | None = None) -> bytes: ...


#: how ``apply`` is run off the loop: (transform, data, url) -> the transformed bytes
Apply = Callable[[Transform, "bytes | bytearray", str], Awaitable[bytes]]


def check_transform(transform: object) -> None:
    """``ConfigError`` unless ``transform`` has ``apply``, a usable ``identity`` (no ``>``,
    which ends it in an entry's source; printable, one line in ``DIR/forms``) and a hash."""
    identity = getattr(transform, "identity", None)
    if not callable(getattr(transform, "apply", None)):
        raise ConfigError(
            "cache presize must have apply(data, url) -> bytes and identity (such as "
            f"concurrent_loader.Presize), got {type(transform).__name__}"
        )
    if not (
        isinstance(identity, str)
        and 0 < len(identity) <= MAX_IDENTITY
        and identity.isprintable()
        and ">" not in identity
        and identity != ORIGINAL
    ):
        raise ConfigError(
            f"cache presize's identity must be a printable name without '>' of 1 to {MAX_IDENTITY} "
            f"characters, got {identity!r}"
        )
    try:
        hash(transform)
    except TypeError:
        raise ConfigError("cache presize must be hashable (a frozen dataclass)") from None


def form_tag(transform: Transform | None) -> str:
    return "" if transform is None else f"<{transform.identity}> "


async def apply_in_thread(transform: Transform, data: bytes | bytearray, url: str) -> bytes:
    return await asyncio.to_thread(transform.apply, data, url)


def process_pool(processes: int | None = None) -> concurrent.futures.ProcessPoolExecutor:
    """Processes to apply a transform in, one per usable core unless told; spawned, since a
    fork would copy the fetch threads mid-step."""
    if processes is None:
        affinity = getattr(os, "sched_getaffinity", None)
        processes = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return concurrent.futures.ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context("spawn")
    )


def apply_in_pool(pool: concurrent.futures.Executor) -> Apply:
    async def run(transform: Transform, data: bytes | bytearray, url: str) -> bytes:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, transform.apply, bytes(data), url)

    return run


async def transformed(transform: Transform, body: Body, url: str, run: Apply) -> Body:
    def failed(why: str) -> DecodeError:
        message = f"{transform.identity} {why}"
        return DecodeError(message, url=url, stage="decode", cause=Reason.UNDECODABLE)

    try:
        data = await run(transform, body.data, url)
    except DecodeError:
        raise
    except Exception as exc:
        raise failed(f"failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, (bytes, bytearray)):
        raise failed(f"gave {type(data).__name__}, not bytes")
    # The ETag names the original's bytes, not these: kept with neither.
    return Body(data, body.first_byte_s, None, round_trip=body.round_trip)


def record_form(directory: str, transform: Transform | None) -> None:
    """Add ``transform``'s label to the cache's record of forms, once (under its lock)."""
    label = ORIGINAL if transform is None else transform.identity
    handles = Handles.open(directory, create=False)
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK
        fd = open_in(handles.root_fd, FORMS_FILE, flags, directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if label not in _labels(os.pread(fd, 1 << 16, 0)):
                os.write(fd, label.encode() + b"\n")
        finally:
            os.close(fd)  # releases the flock
    finally:
        handles.close()


def read_forms(root_fd: int, directory: str) -> list[str]:
    try:
        fd = open_in(root_fd, FORMS_FILE, os.O_RDONLY | os.O_NONBLOCK, directory)
    except FileNotFoundError:
        return []
    try:
        return _labels(os.pread(fd, 1 << 16, 0))
    finally:
        os.close(fd)


def clear_forms(root_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):  # a link in its place goes, not its target
        os.unlink(FORMS_FILE, dir_fd=root_fd)


def _labels(raw: bytes) -> list[str]:
    lines = (line.strip() for line in raw.decode(errors="replace").splitlines())
    return list(dict.fromkeys(line for line in lines if line))
