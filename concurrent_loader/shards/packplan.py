"""What ``concurrent-loader pack`` writes, and where, both checked before anything is written.

The samples (a :data:`PackPlan`): member names split into sample key and extension as both
readers (:class:`~concurrent_loader.ShardDataset` and ``webdataset``) split them, at the
first dot of the last path component. A plan guarantees that every member is read back as
the sample and extension it gives it; that no sample has two members with one extension
(``a.JPG`` and ``a.jpg``; in an image folder ``x.jpg`` and ``x.png``) or a member named as
a field of webdataset's sample (``__key__``...); that samples are in key order with their
members adjacent; and that objects no reader makes part of a sample (a dotfile, no
extension, a metadata name such as ``__meta__/x.json``) are left out and listed as skipped.

The destination (:class:`Destination`, a local directory or an ``s3://`` prefix):
``ShardDataset(DEST)`` reads every ``*.tar`` under its root, so ``DEST`` must not be ``SRC``
nor inside it, must hold no earlier pack (``shard-NNNNNN.tar`` and ``.tar.idx`` at its top
level) unless ``overwrite`` is given (then exactly those files are removed before the first
new shard), and no other ``*.tar`` anywhere. A file is published whole: renamed into place
(local) or uploaded with one PUT (S3). Whatever breaks a rule is a
:class:`~concurrent_loader.ConfigError` naming its objects, raised before anything is written.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..dataset import ImageFolder
from ..errors import ConfigError, Reason
from ..listing import empty_root, list_store
from ..stores import LocalConfig, ObjectInfo, S3Config, StoreConfig
from ..stores.s3.errors import error_for_exception
from .index import INDEX_SUFFIX
from .tar import is_sample_member, split_name

__all__ = ["Destination", "PackEntry", "PackPlan", "Sample", "first_few", "on_s3"]
__all__ += ["plan_image_folder", "plan_objects"]

_SAMPLE_FIELDS = ("__key__", "__url__", "__local_path__")  # what webdataset adds to a sample
_LISTED = 10  # colliding groups or skipped objects named in a message
_PACK_FILE = re.compile(rf"shard-\d{{6}}\.tar({re.escape(INDEX_SUFFIX)})?")


@dataclass(frozen=True)
class PackEntry:
    """One member to write: its name in the tar, the source object it comes from, its size,
    and its bytes when they are not the source's (an image's ``.cls`` label)."""

    name: str
    source: str
    size: int
    data: bytes | None = None


Sample = list[PackEntry]


#: the samples to write, in order, and the source keys left out (see the module)
PackPlan = tuple[list[Sample], list[str]]


def plan_objects(store: StoreConfig, listed: Sequence[ObjectInfo]) -> PackPlan:
    """Each object a member named by its key; the objects with one sample key, one sample."""
    by_key: dict[str, Sample] = {}
    skipped: list[str] = []
    for info in sorted(listed, key=lambda info: info.key):
        split = split_name(info.key)
        # webdataset reads a dotfile "c/.hidden" as sample "c/" (the split backs up a folder)
        dotfile = info.key.rpartition("/")[2].startswith(".")
        if split is None or not is_sample_member(info.key) or dotfile:
            skipped.append(info.key)
        else:
            by_key.setdefault(split[0], []).append(PackEntry(info.key, info.key, info.size))
    return _checked(store, by_key, skipped)


def plan_image_folder(
    store: StoreConfig, listed: Sequence[ObjectInfo], image_extension: str | None = None
) -> PackPlan:
    """Each image ``c/x.jpg`` (chosen as :class:`~concurrent_loader.ImageFolder` chooses)
    sample ``c/x`` with members ``c/x.jpg`` and ``c/x.cls`` (the class index as decimal
    text); dots before the image's extension become ``_`` (``c/a.b.jpg`` is sample ``c/a_b``),
    since both readers split at the first dot. ``image_extension`` replaces every image's
    own (``"jpg"`` or ``"raw"`` for pre-sized images: the member is ``c/x.raw``)."""
    size_of = {info.key: info.size for info in listed}
    folder = ImageFolder(store, keys=list(size_of))
    by_key: dict[str, Sample] = {}
    for image, target in zip(folder.keys, folder.targets.tolist(), strict=True):
        directory, _, filename = image.rpartition("/")
        stem, _, extension = filename.rpartition(".")
        extension = image_extension or extension
        key = f"{directory}/{stem.replace('.', '_')}"
        label = str(target).encode("ascii")
        entries = by_key.setdefault(key, [])  # two images of one key: _checked refuses them
        entries.append(PackEntry(f"{key}.{extension}", image, size_of[image]))
        entries.append(PackEntry(f"{key}.cls", image, len(label), label))
    return _checked(store, by_key, [])


def _checked(store: StoreConfig, by_key: dict[str, Sample], skipped: list[str]) -> PackPlan:
    misread: list[str] = []
    collisions: dict[tuple[str, ...], tuple[str, str]] = {}
    for key, sample in by_key.items():
        sources_of: dict[str, list[str]] = {}
        for entry in sample:
            split = split_name(entry.name)
            if not is_sample_member(entry.name) or split is None or split[0] != key:
                misread.append(f"{store.url_for(entry.source)} (as member {entry.name!r})")
                continue
            sources_of.setdefault(split[1], []).append(entry.source)
        for extension, sources in sources_of.items():
            if len(sources) > 1 or extension in _SAMPLE_FIELDS:
                collisions.setdefault(tuple(dict.fromkeys(sources)), (key, extension))
    if misread:
        raise ConfigError(
            "objects that the readers would not read back as the sample the packer makes of "
            f"them: {first_few(misread)}; rename them",
            url=store.url_for(""),
        )
    if collisions:
        groups = [
            f"{' and '.join(store.url_for(s) for s in sources)} -> sample {key!r}, "
            f"extension {extension!r}"
            for sources, (key, extension) in collisions.items()
        ]
        raise ConfigError(
            "objects that map to one member of one sample, which neither ShardDataset nor "
            "webdataset can read (extensions compare lower-cased; '__key__', '__url__' and "
            "'__local_path__' are fields of the sample; in an image folder each image is a "
            f"sample with a 'cls' member): {first_few(groups)}; rename or remove them",
            url=store.url_for(""),
        )
    samples = [by_key[key] for key in sorted(by_key)]
    if not samples:
        raise empty_root(
            store,
            f"nothing to pack under {store}: none of its {len(skipped)} objects is part of a "
            f"sample (skipped: {first_few(skipped)})",
        )
    return samples, skipped


def first_few(items: Sequence[str]) -> str:
    shown = "; ".join(items[:_LISTED])
    return shown if len(items) <= _LISTED else f"{shown}; and {len(items) - _LISTED} more"


def on_s3(url: str) -> bool:
    return url[:5].lower() == "s3://"


class Destination:
    """``DEST``: a local directory (made at :meth:`begin`), or an ``s3://`` prefix written
    through one botocore client configured as the store's own
    :class:`~concurrent_loader.stores.S3Config` (endpoint, region, addressing style,
    credentials, trust store). Files are written in :attr:`scratch` first."""

    def __init__(self, dest: str, **store_options: Any) -> None:
        self.s3: S3Config | None = None
        if on_s3(dest):
            from botocore import UNSIGNED
            from botocore.config import Config

            self.s3 = s3 = S3Config.from_url(dest, **store_options)
            route = s3.route or s3.resolve_route()
            style = {"addressing_style": s3.addressing_style} if s3.addressing_style else None
            self._client = s3.credentials.botocore_session().create_client(
                "s3",
                endpoint_url=s3.endpoint_url,
                region_name=route.region,
                config=Config(
                    signature_version=UNSIGNED if s3.credentials.anonymous else None, s3=style
                ),
                verify=route.ca_bundle or None,
            )
            self.scratch = tempfile.mkdtemp(prefix="concurrent-loader-pack-")
        elif "://" in dest:
            raise ConfigError(f"DEST must be a local directory or s3://bucket/prefix, got {dest!r}")
        else:
            self.scratch = str(Path(dest).expanduser().resolve())
            if os.path.exists(self.scratch) and not os.path.isdir(self.scratch):
                raise ConfigError("DEST exists and is not a directory", url=self.scratch)

    def __str__(self) -> str:
        return str(self.s3) if self.s3 is not None else self.scratch + os.sep

    def url_for(self, name: str) -> str:
        return self.s3.url_for(name) if self.s3 is not None else os.path.join(self.scratch, name)

    def check(self, source: StoreConfig, overwrite: bool) -> list[str]:
        """The files of an earlier pack that ``overwrite`` allows :meth:`begin` to remove,
        once ``DEST`` passes the checks of the module; nothing is written yet."""
        if self.s3 is None:
            inside = isinstance(source, LocalConfig) and (self.scratch + os.sep).startswith(
                source.root
            )
        else:
            inside = (
                isinstance(source, S3Config)
                and (source.endpoint_url, source.bucket) == (self.s3.endpoint_url, self.s3.bucket)
                and self.s3.prefix.startswith(source.prefix)
            )
        if inside:
            raise ConfigError(
                f"DEST is inside SRC {source}: its shards would be packed as samples of the "
                "next pack of SRC; choose a DEST outside it",
                url=str(self),
            )
        listed: list[str] = []
        if self.s3 is not None or os.path.isdir(self.scratch):
            store = self.s3 or LocalConfig.from_path(self.scratch)
            try:
                listed = [info.key for info in list_store(store)]
            except ConfigError as exc:
                if exc.cause is not Reason.EMPTY_PREFIX:
                    raise
        ours = [key for key in listed if _PACK_FILE.fullmatch(key)]
        foreign = [k for k in listed if k.endswith(".tar") and not _PACK_FILE.fullmatch(k)]
        if foreign:
            raise ConfigError(
                f"DEST holds {len(foreign)} tar files the packer did not write "
                f"({first_few(foreign)}): ShardDataset reads every *.tar under its root, so "
                "they would be read as part of the pack; choose another DEST or remove them",
                url=str(self),
            )
        if ours and not overwrite:
            raise ConfigError(
                f"DEST already holds a pack ({len(ours)} files: {first_few(ours)}): pass "
                "--overwrite (overwrite=True) to replace it, or choose another DEST",
                url=str(self),
            )
        return ours

    def begin(self, stale: list[str]) -> None:
        """The first write, once every check has passed: remove the earlier pack's files."""
        os.makedirs(self.scratch, exist_ok=True)
        for name in stale:
            if self.s3 is None:
                os.unlink(self.url_for(name))
            else:
                self._call("delete_object", name)

    def publish(self, name: str, tmp: str) -> None:
        """The finished file ``tmp`` (in :attr:`scratch`) becomes ``name``, whole."""
        if self.s3 is None:
            os.replace(tmp, self.url_for(name))
        else:
            with open(tmp, "rb") as f:
                self._call("put_object", name, Body=f)

    def close(self) -> None:
        if self.s3 is not None:
            os.rmdir(self.scratch)
            self._client.close()

    def _call(self, operation: str, name: str, **kwargs: Any) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        assert self.s3 is not None
        try:
            getattr(self._client, operation)(
                Bucket=self.s3.bucket, Key=self.s3.prefix + name, **kwargs
            )
        except (BotoCoreError, ClientError) as exc:
            raise error_for_exception(exc, self.url_for(name), stage="write") from exc
