"""concurrent_loader: PyTorch data loading from object storage (S3, GCS, Azure) at local-disk speed.

Users meet it as :class:`ObjectDataset` / :class:`ImageFolder` / :class:`ShardDataset` and
:class:`ConcurrentDataLoader`; ``ARCHITECTURE.md`` draws the path of a sample.
"""

from . import errors
from .config import FetchConfig, HedgeConfig, RetryConfig, Timeouts
from .dataset import IMG_EXTENSIONS, ImageFolder, ObjectDataset
from .decode import EncodedImage
from .errors import *  # noqa: F403  (the error tree: errors.__all__)
from .fetch.parts import PartsConfig
from .loader import (
    ConcurrentDataLoader,
    PartialBatch,
    PartialDict,
    PartialList,
    RayExecutor,
    is_partial,
)
from .pipeline import SkippedSample
from .shards.dataset import ImageSample, ShardDataset
from .stores.azure import AzureConfig
from .stores.gcs import GcsConfig
from .stores.readahead import Readahead
from .stores.s3 import S3Config

__version__ = "0.1.0"

__all__ = ["IMG_EXTENSIONS", "AzureConfig", "ConcurrentDataLoader", "EncodedImage", "FetchConfig"]
__all__ += ["GcsConfig", "HedgeConfig"]
__all__ += ["ImageFolder", "ImageSample", "ObjectDataset", "PartialBatch", "PartialDict"]
__all__ += ["PartialList", "PartsConfig", "RayExecutor", "Readahead", "RetryConfig", "S3Config"]
__all__ += ["ShardDataset"]
__all__ += ["SkippedSample", "Timeouts", "is_partial", *errors.__all__]
