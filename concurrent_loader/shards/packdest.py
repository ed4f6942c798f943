"""Where ``concurrent-loader pack`` writes: a local directory or an ``s3://`` prefix.

Before anything is written, :func:`open_destination` checks that ``ShardDataset(DEST)``
will read the new pack and nothing else (it reads every ``*.tar`` key under its root):

- ``DEST`` is not ``SRC`` nor inside it (a second pack would pack the first one's shards);
- ``DEST`` holds no earlier pack (the packer's own files at its top level,
  ``shard-NNNNNN.tar`` and ``shard-NNNNNN.tar.idx``) unless ``overwrite`` is given; with
  it, exactly those files are removed before the first new shard is written, so no stale
  shard is read with the new ones (a pack that then fails leaves ``DEST`` incomplete);
- ``DEST`` holds no other ``*.tar`` anywhere under it, which the packer does not remove.

A shard is published whole: written to a temporary file, then renamed into place (local)
or uploaded with one PUT (S3); its index follows it.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, cast

from ..errors import ConfigError, Reason
from ..listing import list_store
from ..stores import LocalConfig, ObjectInfo, S3Config, StoreConfig, store_config_for
from ..stores.s3.errors import error_for_exception
from .index import INDEX_SUFFIX
from .packplan import first_few

__all__ = ["Destination", "LocalDestination", "S3Destination", "on_s3", "open_destination"]

_PACK_FILE = re.compile(rf"shard-\d{{6}}\.tar({re.escape(INDEX_SUFFIX)})?")


class LocalDestination:
    """A local directory (made when the first shard is written)."""

    def __init__(self, path: str) -> None:
        self.root = str(Path(path).expanduser().resolve())
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigError(
                "DEST exists and is not a directory", url=self.root, cause=Reason.INVALID_ARGUMENT
            )

    def __str__(self) -> str:
        return self.root + os.sep

    def url_for(self, name: str) -> str:
        return os.path.join(self.root, name)

    def inside(self, source: StoreConfig) -> bool:
        return isinstance(source, LocalConfig) and (self.root + os.sep).startswith(source.root)

    def listed(self) -> list[str]:
        if not os.path.isdir(self.root):
            return []
        return [info.key for info in _listed(LocalConfig.from_path(self.root))]

    def remove(self, names: list[str]) -> None:
        for name in names:
            os.unlink(self.url_for(name))

    def scratch(self) -> str:
        """Where a shard is written before it is published (here: renaming is atomic)."""
        os.makedirs(self.root, exist_ok=True)
        return self.root

    def publish(self, name: str, tmp: str, index: bytes) -> None:
        os.replace(tmp, self.url_for(name))
        _write_file(self.url_for(name) + INDEX_SUFFIX, index)

    def close(self) -> None:
        pass


class S3Destination:
    """An ``s3://bucket/prefix``, written through one botocore client configured as the
    store's own :class:`~concurrent_loader.stores.S3Config` (endpoint, region, addressing
    style, credentials, trust store)."""

    def __init__(self, config: S3Config) -> None:
        from botocore import UNSIGNED
        from botocore.config import Config

        self.config = config
        route = config.route or config.resolve_route()
        self._client = config.credentials.botocore_session().create_client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=route.region,
            config=Config(
                signature_version=UNSIGNED if config.credentials.anonymous else None,
                s3={"addressing_style": config.addressing_style}
                if config.addressing_style
                else None,
            ),
            verify=route.ca_bundle or None,
        )
        self._tmpdir = tempfile.mkdtemp(prefix="concurrent-loader-pack-")

    def __str__(self) -> str:
        return str(self.config)

    def url_for(self, name: str) -> str:
        return self.config.url_for(name)

    def inside(self, source: StoreConfig) -> bool:
        return (
            isinstance(source, S3Config)
            and (source.endpoint_url, source.bucket)
            == (self.config.endpoint_url, self.config.bucket)
            and self.config.prefix.startswith(source.prefix)
        )

    def listed(self) -> list[str]:
        return [info.key for info in _listed(self.config)]

    def remove(self, names: list[str]) -> None:
        for name in names:
            self._call("delete_object", name)

    def scratch(self) -> str:
        return self._tmpdir

    def publish(self, name: str, tmp: str, index: bytes) -> None:
        with open(tmp, "rb") as f:
            self._call("put_object", name, Body=f)
        self._call("put_object", name + INDEX_SUFFIX, Body=index)

    def close(self) -> None:
        os.rmdir(self._tmpdir)
        self._client.close()

    def _call(self, operation: str, name: str, **kwargs: Any) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            getattr(self._client, operation)(
                Bucket=self.config.bucket, Key=self.config.prefix + name, **kwargs
            )
        except (BotoCoreError, ClientError) as exc:
            raise error_for_exception(exc, self.url_for(name), stage="write") from exc


Destination = LocalDestination | S3Destination


def on_s3(url: str) -> bool:
    """Whether ``url`` names an S3 prefix (the side that store options apply to)."""
    return url[:5].lower() == "s3://"


def open_destination(
    dest: str, source: StoreConfig, *, overwrite: bool, **store_options: Any
) -> tuple[Destination, list[str]]:
    """``dest``, checked (see the module), and the files of an earlier pack there that
    ``overwrite`` allows to remove (``destination.remove``); nothing is written yet."""
    destination: Destination
    if on_s3(dest):
        destination = S3Destination(cast(S3Config, store_config_for(dest, **store_options)))
    elif "://" in dest:
        raise ConfigError(
            f"DEST must be a local directory or s3://bucket/prefix, got {dest!r}",
            cause=Reason.INVALID_ARGUMENT,
        )
    else:
        destination = LocalDestination(dest)
    try:
        return destination, _stale(destination, source, overwrite)
    except BaseException:
        destination.close()
        raise


def _stale(destination: Destination, source: StoreConfig, overwrite: bool) -> list[str]:
    if destination.inside(source):
        raise ConfigError(
            f"DEST is inside SRC {source}: its shards would be packed as samples of the next "
            "pack of SRC; choose a DEST outside it",
            url=str(destination),
            cause=Reason.INVALID_ARGUMENT,
        )
    listed = destination.listed()
    ours = [key for key in listed if _PACK_FILE.fullmatch(key)]
    foreign = [key for key in listed if key.endswith(".tar") and not _PACK_FILE.fullmatch(key)]
    if foreign:
        raise ConfigError(
            f"DEST holds {len(foreign)} tar files the packer did not write "
            f"({first_few(foreign)}): ShardDataset reads every *.tar under its root, so they "
            "would be read as part of the pack; choose another DEST or remove them",
            url=str(destination),
            cause=Reason.INVALID_ARGUMENT,
        )
    if ours and not overwrite:
        raise ConfigError(
            f"DEST already holds a pack ({len(ours)} files: {first_few(ours)}): pass "
            "--overwrite (overwrite=True) to replace it, or choose another DEST",
            url=str(destination),
            cause=Reason.INVALID_ARGUMENT,
        )
    return ours


def _listed(store: StoreConfig) -> list[ObjectInfo]:
    try:
        return list_store(store)
    except ConfigError as exc:
        if exc.cause is Reason.EMPTY_PREFIX:
            return []
        raise


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
