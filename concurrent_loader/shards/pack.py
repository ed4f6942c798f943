"""``concurrent-loader pack SRC DEST``: objects (or an ImageFolder) into tar shards + indexes.

``SRC`` is a prefix (``s3://bucket/prefix``) or a local directory; ``DEST`` a local
directory or an ``s3://`` prefix. Store options (``endpoint_url``, ``region``, ``profile``,
``anonymous``...; on the command line ``--endpoint-url``...) apply to whichever side is
remote, to both when both are; given with neither on S3 they are refused. Shards are
``shard-000000.tar``, ``shard-000001.tar``..., each with its index
``shard-000000.tar.idx`` (:mod:`.index`).

Guarantees:

- what is written reads back as the promised samples with both readers,
  :class:`~concurrent_loader.ShardDataset` and the ``webdataset`` library, and
  :attr:`PackResult.samples` is how many they read; ``DEST`` holds the new pack and nothing
  a reader would mix in with it (an earlier pack is refused, or with ``overwrite``
  removed). The rules, the sources refused or skipped and the refusals of ``DEST`` are in
  :mod:`.packplan`; every refusal is a ``ConfigError`` raised before anything is written;
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
  ``_`` in its sample key, since both readers split at the first dot;
- a shard and its index are each published whole (:meth:`.packplan.Destination.publish`),
  so a reader never sees half of one.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from ..config import FetchConfig
from ..dataset import ObjectDataset
from ..errors import ConfigError, Reason
from ..listing import list_store, progress
from ..stores import store_config_for
from .index import INDEX_SUFFIX, ShardIndex
from .packplan import (
    Destination,
    Sample,
    first_few,
    on_s3,
    plan_image_folder,
    plan_objects,
    split_shards,
)
from .tar import Member, padded

__all__ = ["PackResult", "add_pack_arguments", "pack", "parse_size", "run_pack"]

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9}
_UNITS.update({"GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30})
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
    sample, left out; ``removed``: an earlier pack's files that ``overwrite`` removed."""

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
    src_remote = "://" in src and not src.lower().startswith("file://")
    given = sorted(name for name, value in store_options.items() if value not in (None, False))
    if given and not (src_remote or on_s3(dest)):
        raise ConfigError(
            f"{', '.join(given)} apply to an s3:// SRC or DEST; neither {src!r} nor {dest!r} is",
            cause=Reason.INVALID_ARGUMENT,
        )
    fetch_config = fetch_config or FetchConfig()
    store = store_config_for(src, **(store_options if src_remote else {})).resolved()
    destination = Destination(dest, **(store_options if on_s3(dest) else {}))
    try:
        stale = destination.check(store, overwrite)
        listed = list_store(store, fetch_config)
        plan = (plan_image_folder if image_folder else plan_objects)(store, listed)
        reader = ObjectDataset(store, keys=[info.key for info in listed], fetch_config=fetch_config)
        try:
            destination.begin(stale)  # the first write: every check has passed
            position = {info.key: i for i, info in enumerate(listed)}
            shards: list[str] = []
            total = 0
            for shard in split_shards(plan.samples, shard_size):
                name = f"shard-{len(shards):06d}.tar"
                bodies = _bodies(reader, position, shard)
                total += _write(destination, name, shard, bodies, on_sample)
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
        fetched = iter(reader.__getitems__([position[e.source] for e in chunk if e.data is None]))
        for entry in chunk:
            yield next(fetched) if entry.data is None else entry.data


def _write(
    destination: Destination,
    name: str,
    shard: list[Sample],
    bodies: Iterator[bytes],
    on_sample: Callable[[], None] | None,
) -> int:
    """Write shard ``name``, then its index, to ``destination``; the shard's size in bytes."""
    members: list[Member] = []

    def write_tar(f: IO[bytes]) -> None:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for sample in shard:
                for entry in sample:
                    data = next(bodies)
                    header_offset = tar.offset
                    info = tarfile.TarInfo(entry.name)  # mtime, uid, gid 0; no names
                    info.size, info.mode = len(data), 0o444
                    tar.addfile(info, io.BytesIO(data))
                    data_offset = tar.offset - padded(len(data))
                    members.append(Member(entry.name, header_offset, data_offset, len(data)))
                if on_sample is not None:
                    on_sample()

    size = _publish(destination, name, write_tar)
    index = ShardIndex.of_members(members, size).to_json()
    _publish(destination, name + INDEX_SUFFIX, lambda f: f.write(index))
    return size


def _publish(destination: Destination, name: str, write: Callable[[IO[bytes]], Any]) -> int:
    """``write`` a temporary file, then publish it whole as ``name``; its size in bytes."""
    fd, tmp = tempfile.mkstemp(prefix=".packing-", dir=destination.scratch)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            size = f.tell()
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: readable as any other file
        destination.publish(name, tmp)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return size


# ---------------------------------------------------------------------- the command line


def add_pack_arguments(parser: argparse.ArgumentParser) -> None:
    """``DEST`` and the options of ``pack`` (after the common ``SRC`` and store options)."""
    parser.epilog = (
        "--endpoint-url, --region, --profile and --anonymous apply to whichever of SRC and "
        "DEST is on S3, to both when both are. Objects that no reader makes part of a "
        "sample (dotfiles, names without an extension) are skipped and named."
    )
    parser.add_argument("dest", help="a local directory or s3://bucket/prefix for the shards")
    parser.add_argument(
        "--shard-size",
        default="256MB",
        help="close a shard before a sample that would take it past this (default 256MB; "
        "MB/GB are powers of 1000, MiB/GiB of 1024)",
    )
    parser.add_argument(
        "--image-folder",
        action="store_true",
        help="SRC is ROOT/<class>/<image>: add a .cls member (the class index) per image",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier pack in DEST: remove its shard-NNNNNN.tar and .tar.idx "
        "files (and only those) first",
    )


def run_pack(args: argparse.Namespace) -> PackResult:
    """Pack as ``args`` say, naming on stderr what was removed or skipped."""
    shard_size = parse_size(args.shard_size)
    with progress(args.progress, "packing") as tick:
        result = pack(
            args.root,
            args.dest,
            shard_size=shard_size,
            image_folder=args.image_folder,
            overwrite=args.overwrite,
            on_sample=tick,
            endpoint_url=args.endpoint_url,
            region=args.region,
            profile=args.profile,
            anonymous=args.anonymous,
        )
    if result.removed:
        print(f"removed the earlier pack's {len(result.removed)} files", file=sys.stderr)
    if result.skipped:
        print(
            f"skipped {len(result.skipped)} objects that no reader makes part of a sample "
            f"(a dotfile, no extension, or a webdataset metadata name): "
            f"{first_few(result.skipped)}",
            file=sys.stderr,
        )
    return result
