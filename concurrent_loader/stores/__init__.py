"""Storage backends behind one contract (:mod:`.base`): S3 (:mod:`.s3`), Google Cloud Storage
(:mod:`.gcs`), Azure Blob Storage (:mod:`.azure`), plain HTTP(S) (:mod:`.http`), local
directories (:mod:`.local`); :mod:`.registry` maps a root's URL scheme to its backend."""

from .azure import AzureConfig
from .base import Body, ByteRange, Capabilities, ObjectInfo, Store, StoreConfig
from .gcs import GcsConfig
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
    "GcsConfig",
    "HttpConfig",
    "LocalConfig",
    "ObjectInfo",
    "S3Config",
    "Store",
    "StoreConfig",
    "store_config_for",
]
