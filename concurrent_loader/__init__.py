"""concurrent_loader: PyTorch data loading from S3-compatible object storage at local-disk speed.

The pipeline, by folder: :mod:`~concurrent_loader.fetch` (keys -> bytes, many GETs in flight
per process), :mod:`~concurrent_loader.decode` (bytes -> samples, on a thread pool) and
:mod:`~concurrent_loader.gpu` (batches -> device, on a copy stream). Users meet it as
:class:`ObjectDataset` / :class:`ImageFolder` and :class:`ConcurrentDataLoader`.
"""

from .config import FetchConfig, RetryConfig, Timeouts
from .dataloader import ConcurrentDataLoader, PartialBatch, PartialDict, PartialList, is_partial
from .dataset import IMG_EXTENSIONS, ImageFolder, ObjectDataset
from .errors import (
    AccessDenied,
    BadRequest,
    BucketNotFound,
    ConfigError,
    ConnectionFailed,
    DecodeError,
    FetchError,
    FetchTimeout,
    IncompleteBody,
    LoaderError,
    ObjectNotFound,
    ObjectTooLarge,
    ServerError,
    SkipBudgetExceeded,
    Throttled,
    WorkerError,
)
from .pipeline import SkippedSample

__version__ = "0.1.0"

__all__ = [
    "IMG_EXTENSIONS",
    "AccessDenied",
    "BadRequest",
    "BucketNotFound",
    "ConcurrentDataLoader",
    "ConfigError",
    "ConnectionFailed",
    "DecodeError",
    "FetchConfig",
    "FetchError",
    "FetchTimeout",
    "ImageFolder",
    "IncompleteBody",
    "LoaderError",
    "ObjectDataset",
    "ObjectNotFound",
    "ObjectTooLarge",
    "PartialBatch",
    "PartialDict",
    "PartialList",
    "RetryConfig",
    "ServerError",
    "SkipBudgetExceeded",
    "SkippedSample",
    "Throttled",
    "Timeouts",
    "WorkerError",
    "is_partial",
]
