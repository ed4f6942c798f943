"""Where a dataset's objects live: ``s3://bucket/prefix``, ``http(s)://host/base/`` or a local
directory, parsed once and validated, with one way to name an object in messages."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ConfigError

__all__ = ["Location", "parse_location"]

_SCHEMES = ("s3", "http", "https", "file")


@dataclass(frozen=True)
class Location:
    """A parsed root. ``prefix`` always ends with ``/`` unless it is empty.

    - ``s3``: ``bucket`` and the key ``prefix`` (``""`` for the whole bucket);
    - ``http``/``https``: ``netloc`` and the URL path ``prefix``;
    - ``file``: ``prefix`` is an absolute directory path.
    """

    scheme: str
    bucket: str
    prefix: str
    netloc: str = ""

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def url_for(self, key: str) -> str:
        """The name of object ``key`` (relative to the root) as users write it."""
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.prefix}{key}"
        if self.scheme == "file":
            return os.path.join(self.prefix, key)
        return f"{self.scheme}://{self.netloc}{self.prefix}{key}"

    def __str__(self) -> str:
        return self.url_for("")


def parse_location(root: str | os.PathLike[str]) -> Location:
    """Parse ``root``; raise ``ConfigError`` naming it when it is malformed."""
    if isinstance(root, os.PathLike):
        root = os.fspath(root)
    if not isinstance(root, str):
        raise ConfigError(f"root must be a str or path, got {type(root).__name__}")
    if not root:
        raise ConfigError("root is empty")
    if "://" not in root:
        return _local(root)
    scheme = root.split("://", 1)[0].lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"unknown scheme {scheme!r} in {root!r}: expected one of s3://, http://, https://, "
            "file:// or a local path"
        )
    parts = urlsplit(root)
    if scheme == "file":
        return _local(parts.path)
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket:
            raise ConfigError(f"malformed S3 URL {root!r}: expected s3://bucket/prefix")
        prefix = parts.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return Location("s3", bucket, prefix)
    if not parts.netloc:
        raise ConfigError(f"malformed URL {root!r}: no host")
    if parts.username or parts.password:
        raise ConfigError("credentials in a URL are not supported: use the AWS credential chain")
    path = parts.path or "/"
    if not path.endswith("/"):
        path += "/"
    return Location(scheme, "", path, netloc=parts.netloc)


def _local(path: str) -> Location:
    resolved = Path(path).expanduser().resolve()
    text = str(resolved)
    if not text.endswith(os.sep):
        text += os.sep
    return Location("file", "", text)
