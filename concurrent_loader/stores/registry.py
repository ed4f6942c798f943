"""From a dataset's root (a URL or a path) to its backend's store config.

One table maps URL schemes to backends. Adding a backend is one new module with a config
class (see :mod:`concurrent_loader.stores.base`) and one line here. A root given as a URL
or a path gets its backend's defaults; a backend's options are its config object, made by
the caller (``S3Config.from_url("s3://bucket/prefix", endpoint_url=...)``) and given as
the root.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import ConfigError
from .azure import AzureConfig
from .base import StoreConfig
from .gcs import GcsConfig
from .http import HttpConfig
from .local import LocalConfig
from .s3 import S3Config

__all__ = ["BACKENDS", "store_config_for"]

#: URL scheme -> the function that makes its store config, with defaults, from the URL.
BACKENDS: dict[str, Callable[[str], StoreConfig]] = {
    "s3": S3Config.from_url,
    "gs": GcsConfig.from_url,
    "az": AzureConfig.from_url,
    "http": HttpConfig.from_url,
    "https": HttpConfig.from_url,
    "file": lambda url: LocalConfig.from_path(url.removeprefix("file://")),
}


def store_config_for(root: str | os.PathLike[str] | StoreConfig) -> StoreConfig:
    """The store config (with its backend's defaults) for a URL or path, or ``root`` itself."""
    if not isinstance(root, (str, os.PathLike)):
        if hasattr(root, "open") and hasattr(root, "url_for"):
            return root
        raise ConfigError(
            f"root must be a str, a path or a store config, got {type(root).__name__}"
        )
    text = os.fspath(root)
    if not text:
        raise ConfigError("root is empty")
    if "://" not in text:
        return LocalConfig.from_path(text)
    scheme = text.split("://", 1)[0].lower()
    if scheme not in BACKENDS:
        raise ConfigError(
            f"unknown scheme {scheme!r} in {text!r}: expected one of "
            f"{', '.join(s + '://' for s in BACKENDS)} or a local path"
        )
    return BACKENDS[scheme](text)
