"""``concurrent-loader pack SRC DEST``: objects (or an ImageFolder) into tar shards + indexes.

``SRC`` is a prefix (``s3://bucket/prefix``) or a local directory; ``DEST`` a local
directory or an ``s3://`` prefix. Shards are ``shard-000000.tar``, ``shard-000001.tar``...,
each with its index ``shard-000000.tar.idx`` (:mod:`.index`).

Guarantees:

- deterministic: the same input gives the same bytes. Input keys are sorted; every tar
  header has mtime 0, uid/gid 0, no user or group name, mode 0444; the tar is written in
  the POSIX pax format (a pax header only for a name that ustar cannot hold);
- readable by the ``webdataset`` library: each object is a member named by its key; a
  sample's members are adjacent (sorting keeps ``key.*`` together) and never split across
  shards; a shard closes before a sample that would take it past ``shard_size`` (a single
  sample larger than that gets a shard of its own);
- with ``image_folder=True`` (``SRC/<class>/<image>``, chosen as
  :class:`~concurrent_loader.ImageFolder` chooses), each image ``c/x.jpg`` is sample
  ``c/x`` with members ``c/x.jpg`` and ``c/x.cls`` (the class index as decimal text; classes
  are the sorted folder names). Dots in an image's file name before its extension become
  ``_`` in its sample key, since ``webdataset`` splits at the first dot.

A shard is written to a temporary file and then renamed (local) or uploaded (S3), so a
reader never sees half of one.
"""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import FetchConfig
from ..dataset import ImageFolder, ObjectDataset
from ..errors import ConfigError, Reason
from ..listing import list_store
from ..stores import store_config_for
from .index import INDEX_SUFFIX, ShardIndex
from .tar import BLOCK, Member, padded, split_name

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
class _Entry:
    """One member to write: its name in the tar, and where its bytes come from (an object
    key of the source, or the bytes themselves)."""

    name: str
    key: str | None
    data: bytes = b""
    size: int = 0


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote: shard names (relative to ``DEST``), samples and tar bytes."""

    shards: list[str]
    samples: int
    bytes: int


def pack(
    src: str,
    dest: str,
    *,
    shard_size: int = 256 * 10**6,
    image_folder: bool = False,
    fetch_config: FetchConfig | None = None,
    on_sample: Callable[[], None] | None = None,
    **store_options: Any,
) -> PackResult:
    """Pack the objects under ``src`` into shards under ``dest`` (see the module)."""
    if shard_size < 1:
        raise ConfigError(
            f"shard_size must be >= 1, got {shard_size}", cause=Reason.INVALID_ARGUMENT
        )
    fetch_config = fetch_config or FetchConfig()
    store = store_config_for(src, **store_options).resolved()
    listed = list_store(store, fetch_config)
    size_of = {info.key: info.size for info in listed}
    samples = (
        _image_folder_samples(store, [info.key for info in listed], size_of)
        if image_folder
        else _object_samples([info.key for info in listed], size_of)
    )
    reader = ObjectDataset(store, keys=[info.key for info in listed], fetch_config=fetch_config)
    position = {info.key: i for i, info in enumerate(listed)}
    writer = _ShardWriter(dest, store_options)
    total = 0
    try:
        for shard in _split(samples, shard_size):
            total += writer.write(shard, _bodies(reader, position, shard), on_sample)
    finally:
        reader.close()
        writer.close()
    return PackResult(writer.written, len(samples), total)


Sample = list[_Entry]


def _object_samples(keys: Sequence[str], size_of: dict[str, int]) -> list[Sample]:
    """Each object a member named by its key; adjacent members with one key, one sample."""
    samples: list[Sample] = []
    last_key: str | None = None
    for key in sorted(keys):
        split = split_name(key)
        sample_key = split[0] if split else key
        entry = _Entry(key, key, size=size_of[key])
        if samples and sample_key == last_key and split is not None:
            samples[-1].append(entry)
        else:
            samples.append([entry])
        last_key = sample_key
    return samples


def _image_folder_samples(store: Any, keys: list[str], size_of: dict[str, int]) -> list[Sample]:
    folder = ImageFolder(store, keys=keys)
    samples = []
    for key, target in zip(folder.keys, folder.targets.tolist(), strict=True):
        directory, _, filename = key.rpartition("/")
        stem, _, extension = filename.rpartition(".")
        sample_key = f"{directory}/{stem.replace('.', '_')}"
        label = str(target).encode("ascii")
        samples.append(
            [
                _Entry(f"{sample_key}.{extension}", key, size=size_of[key]),
                _Entry(f"{sample_key}.cls", None, label, len(label)),
            ]
        )
    samples.sort(key=lambda sample: sample[0].name)
    return samples


def _split(samples: list[Sample], shard_size: int) -> Iterator[list[Sample]]:
    shard: list[Sample] = []
    used = 0
    for sample in samples:
        size = sum(BLOCK + padded(entry.size) for entry in sample)
        if shard and used + size > shard_size:
            yield shard
            shard, used = [], 0
        shard.append(sample)
        used += size
    if shard:
        yield shard


def _bodies(
    reader: ObjectDataset, position: dict[str, int], shard: list[Sample]
) -> Iterator[bytes]:
    """The bytes of each entry of ``shard``, in order, fetched ``_FETCH_CHUNK`` at a time."""
    entries = [entry for sample in shard for entry in sample]
    for start in range(0, len(entries), _FETCH_CHUNK):
        chunk = entries[start : start + _FETCH_CHUNK]
        wanted = [position[e.key] for e in chunk if e.key is not None]
        fetched = iter(reader.__getitems__(wanted))
        for entry in chunk:
            yield entry.data if entry.key is None else next(fetched)


class _ShardWriter:
    """Writes shards (and their indexes) to a local directory or an S3 prefix."""

    def __init__(self, dest: str, store_options: dict[str, Any]) -> None:
        self.dest = dest
        self.written: list[str] = []
        self._s3: Any = None
        if dest.startswith("s3://"):
            bucket, _, prefix = dest[len("s3://") :].partition("/")
            self._bucket = bucket
            self._prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
            self._s3 = _s3_client(store_options)
            self._tmpdir = tempfile.mkdtemp(prefix="concurrent-loader-pack-")
        elif "://" in dest:
            raise ConfigError(
                f"DEST must be a local directory or s3://bucket/prefix, got {dest!r}",
                cause=Reason.INVALID_ARGUMENT,
            )
        else:
            os.makedirs(dest, exist_ok=True)
            self._tmpdir = dest

    def write(
        self, shard: list[Sample], bodies: Iterator[bytes], on_sample: Callable[[], None] | None
    ) -> int:
        name = f"shard-{len(self.written):06d}.tar"
        fd, tmp = tempfile.mkstemp(prefix=".packing-", dir=self._tmpdir)
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
                            members.append(
                                Member(entry.name, header_offset, data_offset, len(data))
                            )
                        if on_sample is not None:
                            on_sample()
                size = f.tell()
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600: readable as any other file
            index = ShardIndex.of_members(members, size).to_json()
            self._publish(name, tmp, index)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.written.append(name)
        return size

    def _publish(self, name: str, tmp: str, index: bytes) -> None:
        if self._s3 is None:
            os.replace(tmp, os.path.join(self.dest, name))
            _write_file(os.path.join(self.dest, name + INDEX_SUFFIX), index)
            return
        with open(tmp, "rb") as f:
            self._s3.put_object(Bucket=self._bucket, Key=self._prefix + name, Body=f)
        self._s3.put_object(Bucket=self._bucket, Key=self._prefix + name + INDEX_SUFFIX, Body=index)

    def close(self) -> None:
        if self._s3 is not None:
            os.rmdir(self._tmpdir)
            self._s3.close()
            self._s3 = None


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


def _write_file(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".packing-", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _s3_client(store_options: dict[str, Any]) -> Any:
    import botocore.session

    session = botocore.session.Session(profile=store_options.get("profile"))
    return session.create_client(
        "s3",
        endpoint_url=store_options.get("endpoint_url"),
        region_name=store_options.get("region"),
    )
