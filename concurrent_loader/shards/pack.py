"""``concurrent-loader pack SRC DEST``: objects (or an ImageFolder) into tar shards + indexes.

``SRC`` and ``DEST`` are local directories or ``s3://`` prefixes (store options apply to
whichever is on S3). Shards are ``shard-000000.tar``..., each with its index ``.tar.idx``
(:mod:`.index`). Guarantees:

- what is written reads back as the promised samples with both ``ShardDataset`` and
  ``webdataset`` (:attr:`PackResult.samples` is how many), and ``DEST`` holds nothing a
  reader would mix in with them; the rules and refusals are in :mod:`.packplan`;
- deterministic: samples in key order; every tar header has mtime 0, uid/gid 0, no user or
  group name, mode 0444, in the POSIX pax format;
- a sample's members are adjacent and never split across shards; a shard closes before a
  sample that would take it past ``shard_size`` (a larger sample gets a shard of its own);
- with ``image_folder=True`` (``SRC/<class>/<image>``), image ``c/x.jpg`` is sample ``c/x``
  with members ``c/x.jpg`` and ``c/x.cls`` (the class index as text; :mod:`.packplan`);
- with ``presize`` (image folders only), each image is stored pre-sized as ``c/x.jpg`` or
  ``c/x.raw``, re-encoded by ``processes`` processes while the next objects are fetched; an
  image that cannot be decoded ends the pack with a ``DecodeError``;
- a shard and its index are each published whole, so a reader never sees half of one.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import re
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import IO, Any

from ..cache.form import process_pool
from ..config import check_count
from ..dataset import ObjectDataset
from ..decode.presize import FORMATS, Presize
from ..errors import ConfigError
from ..listing import list_store, progress
from ..stores import S3Config, StoreConfig, store_config_for
from .index import INDEX_SUFFIX, ShardIndex
from .packplan import Destination, Sample, first_few, on_s3, plan_image_folder, plan_objects
from .tar import BLOCK, Member, padded

__all__ = ["PackResult", "add_pack_arguments", "pack", "parse_size", "presize_from", "run_pack"]

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9}
_UNITS.update({"GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30})
_FETCH_CHUNK = 64  # objects fetched concurrently while packing
#: the member extension of a pre-sized image, by :attr:`Presize.format`
PRESIZED_EXTENSION = {"jpeg": "jpg", "raw": "raw"}


def parse_size(text: str) -> int:
    """Bytes in ``"256MB"`` (powers of 1000), ``"256MiB"`` (of 1024) or ``"1000"``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ConfigError(
            f"bad size {text!r}: expected a positive number of bytes like 256MB or 64MiB"
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
    on_sample: Callable[[], None] | None = None,
    presize: Presize | None = None,
    processes: int | None = None,
    **store_options: Any,
) -> PackResult:
    """Pack the objects under ``src`` into shards under ``dest`` (see the module)."""
    check_count("shard_size", shard_size)
    if presize is not None and not image_folder:
        raise ConfigError(
            "pre-sizing (--resize) needs --image-folder: only an image folder's samples are "
            "known to hold one image each"
        )
    if processes is not None:
        check_count("processes", processes)
    given = sorted(name for name, value in store_options.items() if value not in (None, False))
    if given and not (on_s3(src) or on_s3(dest)):
        raise ConfigError(
            f"{', '.join(given)} apply to an s3:// SRC or DEST; neither {src!r} nor {dest!r} is"
        )
    store = (
        S3Config.from_url(src, **store_options) if on_s3(src) else store_config_for(src)
    ).resolved()
    destination = Destination(dest, **(store_options if on_s3(dest) else {}))
    try:
        stale = destination.check(store, overwrite)
        listed = list_store(store)
        extension = PRESIZED_EXTENSION[presize.format] if presize is not None else None
        if image_folder:
            samples, skipped = plan_image_folder(store, listed, extension)
        else:
            samples, skipped = plan_objects(store, listed)
        reader = ObjectDataset(store, keys=[info.key for info in listed])
        pool = process_pool(processes) if presize is not None and processes != 1 else None
        try:
            destination.begin(stale)  # the first write: every check has passed
            position = {info.key: i for i, info in enumerate(listed)}
            ready = _ready(reader, position, samples, store, presize, pool)
            head = next(ready, None)
            shards: list[str] = []
            total = 0
            while head is not None:
                name = f"shard-{len(shards):06d}.tar"
                size, head = _write(destination, name, head, ready, shard_size, presize, on_sample)
                total += size
                shards.append(name)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
            reader.close()
    finally:
        destination.close()
    return PackResult(shards, len(samples), total, skipped, stale)


#: a sample, its members' bytes, and the original sizes of its pre-sized images
_Ready = tuple[Sample, list[bytes], dict[str, tuple[int, int]]]


def _ready(
    reader: ObjectDataset,
    position: dict[str, int],
    samples: list[Sample],
    store: StoreConfig,
    presize: Presize | None,
    pool: concurrent.futures.ProcessPoolExecutor | None,
) -> Iterator[_Ready]:
    """Each sample with its bytes, in order, fetched about ``_FETCH_CHUNK`` objects at a
    time; with ``presize``, a chunk's images are re-encoded (in ``pool`` while the next
    chunk is fetched, or here)."""
    chunks: list[list[Sample]] = [[]]
    for sample in samples:
        if sum(len(s) for s in chunks[-1]) + len(sample) > _FETCH_CHUNK and chunks[-1]:
            chunks.append([])
        chunks[-1].append(sample)
    pending: list[tuple[list[Sample], list[bytes], list[Any]]] = []
    for chunk in chunks:
        entries = [entry for sample in chunk for entry in sample]
        fetched = iter(reader.__getitems__([position[e.source] for e in entries if e.data is None]))
        bodies = [next(fetched) if e.data is None else e.data for e in entries]
        jobs = [
            None
            if presize is None or entry.data is not None
            else pool.submit(presize.apply_sized, body, store.url_for(entry.source))
            if pool is not None
            else presize.apply_sized(body, store.url_for(entry.source))
            for entry, body in zip(entries, bodies, strict=True)
        ]
        pending.append((chunk, bodies, jobs))
        if len(pending) > 1:
            yield from _finished(*pending.pop(0))
    while pending:
        yield from _finished(*pending.pop(0))


def _finished(chunk: list[Sample], bodies: list[bytes], jobs: list[Any]) -> Iterator[_Ready]:
    """Each sample of ``chunk`` with its bytes; a job is a pre-sizing (done or in a pool)."""
    done = iter(zip([e for sample in chunk for e in sample], bodies, jobs, strict=True))
    for sample in chunk:
        out: list[bytes] = []
        sizes: dict[str, tuple[int, int]] = {}
        for entry, body, job in (next(done) for _ in sample):
            if job is not None:
                body, sizes[entry.name] = job.result() if isinstance(job, Future) else job
            out.append(body)
        yield sample, out, sizes


def _write(
    destination: Destination,
    name: str,
    head: _Ready,
    ready: Iterator[_Ready],
    shard_size: int,
    presize: Presize | None,
    on_sample: Callable[[], None] | None,
) -> tuple[int, _Ready | None]:
    """Write shard ``name`` and its index from ``head`` and the samples after it, up to
    ``shard_size``: the shard's size in bytes, and the first sample left for the next."""
    members: list[Member] = []
    original_sizes: dict[str, tuple[int, int]] = {}
    left: _Ready | None = head

    def write_tar(f: IO[bytes]) -> None:
        nonlocal left
        used = 0
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            while left is not None:
                sample, bodies, sizes = left
                size = sum(BLOCK + padded(len(data)) for data in bodies)
                if used and used + size > shard_size:
                    break
                for entry, data in zip(sample, bodies, strict=True):
                    header_offset = tar.offset
                    info = tarfile.TarInfo(entry.name)  # mtime, uid, gid 0; no names
                    info.size, info.mode = len(data), 0o444
                    tar.addfile(info, io.BytesIO(data))
                    data_offset = tar.offset - padded(len(data))
                    members.append(Member(entry.name, header_offset, data_offset, len(data)))
                original_sizes.update(sizes)
                used += size
                left = next(ready, None)
                if on_sample is not None:
                    on_sample()

    size = _publish(destination, name, write_tar)
    identity = presize.identity if presize is not None else None
    index = ShardIndex.of_members(members, size, identity, original_sizes).to_json()
    _publish(destination, name + INDEX_SUFFIX, lambda f: f.write(index))
    return size, left


def _publish(destination: Destination, name: str, write: Callable[[IO[bytes]], Any]) -> int:
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
        "--resize",
        type=int,
        metavar="SHORT_SIDE",
        help="with --image-folder: store each image pre-sized to this shorter side (never "
        "upscaled, aspect kept) as c/x.jpg, or c/x.raw with --format raw",
    )
    add_presize_arguments(parser, "--resize")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier pack in DEST: remove its shard-NNNNNN.tar and .tar.idx "
        "files (and only those) first",
    )


def add_presize_arguments(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--format``, ``--quality`` and ``--processes``, which apply to ``flag`` (pre-sizing to
    a shorter side), for ``pack`` and ``cache warm``."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        help=f"with {flag}: a re-encoded JPEG (default) or raw uint8 pixels (no decode when "
        "read, several times the bytes)",
    )
    parser.add_argument("--quality", type=int, help=f"with {flag}: the JPEG quality (default 90)")
    parser.add_argument(
        "--processes", type=int, help=f"with {flag}: processes that re-encode (default: cores)"
    )


def presize_from(args: argparse.Namespace, short_side: int | None, flag: str) -> Presize | None:
    """The pre-sizing ``args`` ask for with ``flag`` (its value ``short_side``), or None."""
    given = {"format": args.format, "quality": args.quality}
    if short_side is None:
        if args.processes is not None or any(v is not None for v in given.values()):
            raise ConfigError(
                f"--format, --quality and --processes apply to {flag}, which is not given"
            )
        return None
    if args.processes is not None:
        check_count("--processes", args.processes)
    return Presize(short_side, **{k: v for k, v in given.items() if v is not None})


def run_pack(args: argparse.Namespace) -> PackResult:
    """Pack as ``args`` say, naming on stderr what was removed or skipped."""
    shard_size = parse_size(args.shard_size)
    presize = presize_from(args, args.resize, "--resize")
    with progress(args.progress, "packing") as tick:
        result = pack(
            args.root,
            args.dest,
            shard_size=shard_size,
            image_folder=args.image_folder,
            overwrite=args.overwrite,
            on_sample=tick,
            presize=presize,
            processes=args.processes,
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
