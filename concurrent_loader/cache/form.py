"""What form an entry keeps: the object's bytes as fetched, or a transform of them.

A cache given a transform (``CacheConfig(presize=...)``: any object with ``apply(data, url)
-> bytes`` and ``identity: str``, such as :class:`concurrent_loader.decode.presize.Presize`)
keeps ``transform.apply(original)`` instead of the original and returns it on a miss too, so
every read of an object, the first included, gets the same form. Guarantees:

- The setting is part of each entry's identity: its source (hashed into the entry's name and
  checked when it is read, :mod:`.entry`) starts with ``<identity> ``, so an entry made under
  one setting (or of the original) is never served under another; entries of several
  settings may share a directory and its budget.
- ``DIR/forms`` records every setting that read through the directory (``original`` for
  none), one per line, for ``concurrent-loader cache info``; it is a record, never consulted
  to serve a read.
- ``apply`` runs off the event loop (a thread, or the process pool a warm-up gives). What it
  raises fails that read: a :class:`~concurrent_loader.errors.DecodeError` as it is (it
  names the object), anything else as a ``DecodeError`` naming the object with it as the
  cause. Such an object is not cached: it fails again on every read, never dropped silently.
- A ranged read with a transform set is not served from (nor stored in) the cache: an entry
  holds the transformed bytes, whose ranges mean nothing; it gets the original's range.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import os
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from ..errors import ConfigError, DecodeError, Reason
from ..stores.base import Body
from .layout import Handles, _open_in

__all__ = [
    "FORMS_FILE",
    "ORIGINAL",
    "Apply",
    "Transform",
    "apply_in_pool",
    "apply_in_thread",
    "check_transform",
    "clear_forms",
    "form_label",
    "form_tag",
    "read_forms",
    "record_form",
    "transformed",
]

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


#: how ``apply`` is run: (transform, data, url) -> the transformed bytes, off the loop
Apply = Callable[[Transform, "bytes | bytearray", str], Awaitable[bytes]]


def check_transform(transform: object) -> None:
    """``ConfigError`` unless ``transform`` has ``apply`` and a usable ``identity``."""
    if not callable(getattr(transform, "apply", None)):
        raise ConfigError(
            "cache presize must have apply(data, url) -> bytes and identity "
            f"(such as concurrent_loader.Presize), got {type(transform).__name__}",
            cause=Reason.INVALID_ARGUMENT,
        )
    identity = getattr(transform, "identity", None)
    if (
        not isinstance(identity, str)
        or not identity
        or len(identity) > MAX_IDENTITY
        or not identity.isprintable()
        or ">" in identity
        or identity == ORIGINAL
    ):
        raise ConfigError(
            f"cache presize's identity must be a printable name without '>' of 1 to "
            f"{MAX_IDENTITY} characters, got {identity!r}",
            cause=Reason.INVALID_ARGUMENT,
        )
    try:
        hash(transform)
    except TypeError:
        raise ConfigError(
            f"cache presize must be hashable (a frozen dataclass), got {type(transform).__name__}",
            cause=Reason.INVALID_ARGUMENT,
        ) from None


def form_label(transform: Transform | None) -> str:
    """How ``DIR/forms`` and ``cache info`` name the form: the identity, or ``original``."""
    return ORIGINAL if transform is None else transform.identity


def form_tag(transform: Transform | None) -> str:
    """What starts the source of every entry kept in this form ('' for the original)."""
    return "" if transform is None else f"<{transform.identity}> "


async def apply_in_thread(transform: Transform, data: bytes | bytearray, url: str) -> bytes:
    return await asyncio.to_thread(transform.apply, data, url)


def apply_in_pool(pool: concurrent.futures.Executor) -> Apply:
    """``apply`` run in ``pool`` (a process pool: a warm-up re-encodes on every core)."""

    async def run(transform: Transform, data: bytes | bytearray, url: str) -> bytes:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, transform.apply, bytes(data), url)

    return run


async def transformed(transform: Transform, body: Body, url: str, run: Apply) -> Body:
    """``body`` (a whole object) in ``transform``'s form; see the module docstring for
    errors."""
    try:
        data = await run(transform, body.data, url)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(
            f"{transform.identity} failed: {type(exc).__name__}: {exc}",
            url=url,
            stage="decode",
            cause=Reason.UNDECODABLE,
        ) from exc
    if not isinstance(data, (bytes, bytearray)):
        raise DecodeError(
            f"{transform.identity} gave {type(data).__name__}, not bytes",
            url=url,
            stage="decode",
            cause=Reason.UNDECODABLE,
        )
    # The ETag names the original's bytes, not these: kept with neither.
    return Body(data, body.first_byte_s, None, round_trip=body.round_trip)


def record_form(directory: str, label: str) -> None:
    """Add ``label`` to the cache's record of forms, once (under a lock of the record)."""
    handles = Handles.open(directory, create=False)
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK
        fd = _open_in(handles.root_fd, FORMS_FILE, flags, directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if label not in _labels(os.pread(fd, 1 << 16, 0)):
                os.write(fd, label.encode() + b"\n")
        finally:
            os.close(fd)  # releases the flock
    finally:
        handles.close()


def read_forms(root_fd: int, directory: str) -> list[str]:
    """The forms recorded in the cache open at ``root_fd`` ([] for none recorded)."""
    try:
        fd = _open_in(root_fd, FORMS_FILE, os.O_RDONLY | os.O_NONBLOCK, directory)
    except FileNotFoundError:
        return []
    try:
        return _labels(os.pread(fd, 1 << 16, 0))
    finally:
        os.close(fd)


def clear_forms(root_fd: int, directory: str) -> None:
    """Empty the record (the cache was cleared)."""
    with contextlib.suppress(FileNotFoundError):
        fd = _open_in(root_fd, FORMS_FILE, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK, directory)
        os.close(fd)


def _labels(raw: bytes) -> list[str]:
    seen: dict[str, None] = {}
    for line in raw.decode(errors="replace").splitlines():
        if line.strip():
            seen.setdefault(line.strip())
    return list(seen)
