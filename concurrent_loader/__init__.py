"""concurrent_loader: PyTorch data loading from S3-compatible object storage at local-disk speed.

Users meet it as :class:`ObjectDataset` / :class:`ImageFolder` / :class:`ShardDataset` and
:class:`ConcurrentDataLoader`; ``ARCHITECTURE.md`` draws the path of a sample.
"""

from .config import FetchConfig, HedgeConfig, RetryConfig, Timeouts
from .dataset import IMG_EXTENSIONS, ImageFolder, ObjectDataset
from .decode import EncodedImage
from .errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    CertificateRefused,
    ConfigError,
    ConnectionFailed,
    DecodeError,
    FetchError,
    FetchTimeout,
    IncompleteBody,
    IntegrityError,
    LoaderError,
    LoaderStalled,
    ObjectNotFound,
    ObjectTooLarge,
    Reason,
    ServerError,
    ShardError,
    SkipBudgetExceeded,
    Throttled,
    WorkerError,
)
from .fetch.parts import PartsConfig
from .loader import ConcurrentDataLoader, PartialBatch, PartialDict, PartialList, is_partial
from .pipeline import SkippedSample
from .shards.dataset import ImageSample, ShardDataset
from .stores.readahead import Readahead
from .stores.s3 import S3Config

__version__ = "0.1.0"

__all__ = [
    "IMG_EXTENSIONS",
    "AccessDenied",
    "BadRequest",
    "BucketNotFound",
    "CertificateRefused",
    "ConcurrentDataLoader",
    "ConfigError",
    "ConnectionFailed",
    "DecodeError",
    "EncodedImage",
    "FetchConfig",
    "FetchError",
    "FetchTimeout",
    "HedgeConfig",
    "ImageFolder",
    "ImageSample",
    "IncompleteBody",
    "IntegrityError",
    "LoaderError",
    "LoaderStalled",
    "ObjectDataset",
    "ObjectNotFound",
    "ObjectTooLarge",
    "PartialBatch",
    "PartialDict",
    "PartialList",
    "PartsConfig",
    "Readahead",
    "Reason",
    "RetryConfig",
    "S3Config",
    "ServerError",
    "ShardDataset",
    "ShardError",
    "SkipBudgetExceeded",
    "SkippedSample",
    "Throttled",
    "Timeouts",
    "WorkerError",
    "is_partial",
]
