"""Storage backends behind one contract (:mod:`.base`): S3 (:mod:`.s3`), Azure Blob Storage
(:mod:`.azure`), plain HTTP(S) (:mod:`.http`), local directories (:mod:`.local`);
:mod:`.registry` maps a root's URL scheme to its backend."""

from .azure import AzureConfig
from .base import Body, ByteRange, Capabilities, ObjectInfo, Store, StoreConfig
from .http import HttpConfig
from .local import LocalConfig
from .registry import BACKENDS, store_config_for
from .s3 import CredentialSource, S3Config

__all__ = [
    "BACKENDS",
    "AzureConfig",
    "Body",
    "ByteRange",
    "Capabilities",
    "CredentialSource",
    "HttpConfig",
    "LocalConfig",
    "ObjectInfo",
    "S3Config",
    "Store",
    "StoreConfig",
    "store_config_for",
]
