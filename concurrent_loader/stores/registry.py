"""From a dataset's root (a URL or a path) to its backend's store config.

One table maps URL schemes to backends. Adding a backend is one new module with a config
class (see :mod:`concurrent_loader.stores.base`) and one line here; the dataset's keyword
arguments reach the backend's ``from_url``, and an option the backend does not take is a
``ConfigError`` naming it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, Reason
from .base import StoreConfig
from .http import HttpConfig
from .local import LocalConfig
from .s3 import S3Config

__all__ = ["BACKENDS", "store_config_for"]

#: URL scheme -> the function that makes its store config from the URL and options.
BACKENDS: dict[str, Callable[..., StoreConfig]] = {
    "s3": S3Config.from_url,
    "http": HttpConfig.from_url,
    "https": HttpConfig.from_url,
    "file": lambda url: LocalConfig.from_path(url.removeprefix("file://")),
}


def store_config_for(root: str | os.PathLike[str] | StoreConfig, **options: Any) -> StoreConfig:
    """The store config for ``root``: a URL (``s3://``, ``http(s)://``, ``file://``), a local
    path, or a store config already (returned as is). An option that is None is not passed
    on, nor is False to a backend that does not take it (``anonymous=False`` for a local
    path); a backend that takes it gets it, so ``verify_checksums=False`` turns checks off.
    Any other option the backend does not take is a ``ConfigError``."""
    if not isinstance(root, (str, os.PathLike)):
        if hasattr(root, "open") and hasattr(root, "url_for"):
            return root
        raise ConfigError(
            f"root must be a str, a path or a store config, got {type(root).__name__}",
            cause=Reason.INVALID_ARGUMENT,
        )
    text = os.fspath(root)
    if not text:
        raise ConfigError("root is empty", cause=Reason.INVALID_ARGUMENT)
    if "://" not in text:
        make: Callable[..., StoreConfig] = LocalConfig.from_path
    else:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in BACKENDS:
            raise ConfigError(
                f"unknown scheme {scheme!r} in {text!r}: expected one of "
                f"{', '.join(s + '://' for s in BACKENDS)} or a local path",
                cause=Reason.INVALID_ARGUMENT,
            )
        make = BACKENDS[scheme]
    accepted = inspect.signature(make).parameters
    given = {
        name: value
        for name, value in options.items()
        if value is not None and (value is not False or name in accepted)
    }
    unknown = sorted(name for name in given if name not in accepted)
    if unknown:
        raise ConfigError(
            f"{', '.join(unknown)} do(es) not apply to {text!r}", cause=Reason.INVALID_ARGUMENT
        )
    return make(text, **given)
