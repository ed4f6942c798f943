"""``concurrent-loader pack SRC DEST``: objects (or an ImageFolder) into tar shards + indexes.

``SRC`` is a prefix (``s3://bucket/prefix``) or a local directory; ``DEST`` a local
directory or an ``s3://`` prefix. Store options (``endpoint_url``, ``region``, ``profile``,
``anonymous``...) apply to whichever side is remote, to both when both are. Shards are
``shard-000000.tar``, ``shard-000001.tar``..., each with its index
``shard-000000.tar.idx`` (:mod:`.index`).

Guarantees:

- what is written reads back as the promised samples with both readers,
  :class:`~concurrent_loader.ShardDataset` and the ``webdataset`` library, and
  :attr:`PackResult.samples` is how many they read: the rules, and the sources refused or
  skipped, are in :mod:`.packplan`; ``DEST`` holds the new pack and nothing a reader would
  mix in with it (:mod:`.packdest`: an earlier pack is refused, or with ``overwrite``
  removed). Every refusal is a ``ConfigError`` raised before anything is written;
- deterministic: the same input gives the same bytes. Samples are in key order; every tar
  header has mtime 0, uid/gid 0, no user or group name, mode 0444; the tar is written in
  the POSIX pax format (a pax header only for a name that ustar cannot hold);
- a sample's members are adjacent and never split across shards; a shard closes before a
  sample that would take it past ``shard_size`` (a single sample larger than that gets a
  shard of its own);
- with ``image_folder=True`` (``SRC/<class>/<image>``, chosen as
  :class:`~concurrent_loader.ImageFolder` chooses), each image ``c/x.jpg`` is sample
  ``c/x`` with members ``c/x.jpg`` and ``c/x.cls`` (the class index as decimal text; classes
  are the sorted folder names). Dots in an image's file name before its extension become
  ``_`` in its sample key, since both readers split at the first dot.

A shard is written to a temporary file and then renamed (local) or uploaded (S3), so a
reader never sees half of one.
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import FetchConfig
from ..dataset import ObjectDataset
from ..errors import ConfigError, Reason
from ..listing import list_store
from ..stores import store_config_for
from .index import ShardIndex
from .packdest import Destination, on_s3, open_destination
from .packplan import Sample, plan_image_folder, plan_objects, split_shards
from .tar import Member, padded

__all__ = ["PackResult", "pack", "parse_size"]

_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}
_FETCH_CHUNK = 64  # objects fetched concurrently while packing


def parse_size(text: str) -> int:
    """Bytes in ``"256MB"`` (powers of 1000), ``"256MiB"`` (of 1024) or ``"1000"``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ConfigError(
            f"bad size {text!r}: expected a positive number of bytes like 256MB or 64MiB",
            cause=Reason.INVALID_ARGUMENT,
        )
    return int(float(match.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote: shard names (relative to ``DEST``), samples (as both readers
    count them) and tar bytes; ``skipped``: the source keys no reader would make part of a
    sample, left out (:mod:`.packplan`); ``removed``: an earlier pack's files that
    ``overwrite`` removed from ``DEST``."""

    shards: list[str]
    samples: int
    bytes: int
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def pack(
    src: str,
    dest: str,
    *,
    shard_size: int = 256 * 10**6,
    image_folder: bool = False,
    overwrite: bool = False,
    fetch_config: FetchConfig | None = None,
    on_sample: Callable[[], None] | None = None,
    **store_options: Any,
) -> PackResult:
    """Pack the objects under ``src`` into shards under ``dest`` (see the module)."""
    if shard_size < 1:
        raise ConfigError(
            f"shard_size must be >= 1, got {shard_size}", cause=Reason.INVALID_ARGUMENT
        )
    # Store options belong to the remote side(s), not to a local directory.
    src_remote = "://" in src and not src.lower().startswith("file://")
    given = sorted(name for name, value in store_options.items() if value not in (None, False))
    if given and not (src_remote or on_s3(dest)):
        raise ConfigError(
            f"{', '.join(given)} apply to an s3:// SRC or DEST; neither {src!r} nor {dest!r} is",
            cause=Reason.INVALID_ARGUMENT,
        )
    fetch_config = fetch_config or FetchConfig()
    store = store_config_for(src, **(store_options if src_remote else {})).resolved()
    destination, stale = open_destination(
        dest, store, overwrite=overwrite, **(store_options if on_s3(dest) else {})
    )
    try:
        listed = list_store(store, fetch_config)
        plan = (plan_image_folder if image_folder else plan_objects)(store, listed)
        reader = ObjectDataset(store, keys=[info.key for info in listed], fetch_config=fetch_config)
        try:
            destination.remove(stale)  # the first write: every check has passed
            position = {info.key: i for i, info in enumerate(listed)}
            shards: list[str] = []
            total = 0
            for shard in split_shards(plan.samples, shard_size):
                name = f"shard-{len(shards):06d}.tar"
                total += _write(
                    destination, name, shard, _bodies(reader, position, shard), on_sample
                )
                shards.append(name)
        finally:
            reader.close()
    finally:
        destination.close()
    return PackResult(shards, len(plan.samples), total, plan.skipped, stale)


def _bodies(
    reader: ObjectDataset, position: dict[str, int], shard: list[Sample]
) -> Iterator[bytes]:
    """The bytes of each entry of ``shard``, in order, fetched ``_FETCH_CHUNK`` at a time."""
    entries = [entry for sample in shard for entry in sample]
    for start in range(0, len(entries), _FETCH_CHUNK):
        chunk = entries[start : start + _FETCH_CHUNK]
        wanted = [position[e.source] for e in chunk if e.data is None]
        fetched = iter(reader.__getitems__(wanted))
        for entry in chunk:
            yield next(fetched) if entry.data is None else entry.data


def _write(
    destination: Destination,
    name: str,
    shard: list[Sample],
    bodies: Iterator[bytes],
    on_sample: Callable[[], None] | None,
) -> int:
    """Write shard ``name`` and its index to ``destination``; its size in bytes."""
    fd, tmp = tempfile.mkstemp(prefix=".packing-", dir=destination.scratch())
    members: list[Member] = []
    try:
        with os.fdopen(fd, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for sample in shard:
                    for entry in sample:
                        data = next(bodies)
                        header_offset = tar.offset
                        tar.addfile(_tarinfo(entry.name, len(data)), _Reader(data))
                        data_offset = tar.offset - padded(len(data))
                        members.append(Member(entry.name, header_offset, data_offset, len(data)))
                    if on_sample is not None:
                        on_sample()
            size = f.tell()
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: readable as any other file
        destination.publish(name, tmp, ShardIndex.of_members(members, size).to_json())
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return size


class _Reader:
    """A file-like view of bytes for ``TarFile.addfile``."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else self._pos + size
        chunk = bytes(self._view[self._pos : end])
        self._pos += len(chunk)
        return chunk


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info
