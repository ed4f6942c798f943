"""``ShardDataset``: a map-style dataset over WebDataset tar shards, random access by index.

Samples are numbered shard by shard, in tar order (:attr:`ShardDataset.shards`,
:attr:`ShardDataset.shard_lengths`), so a sampler can draw them shard by shard; being
map-style, everything ``ConcurrentDataLoader`` promises holds unchanged. Like
:class:`~concurrent_loader.ObjectDataset`, it holds configuration and nothing open, so it
pickles to ``spawn`` workers; ``ds[i]`` and ``__getitems__`` work without our loader.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from ..cache import CacheConfig
from ..config import FetchConfig
from ..dataset import ObjectDataset
from ..decode import EncodedImageDecoder, ImageDecoder, image_decoder
from ..errors import ConfigError, ObjectNotFound, Reason, ShardError
from ..listing import empty_root, list_store
from ..listing import progress as progress_bar
from ..stores import StoreConfig, store_config_for
from ..stores.readahead import Readahead, ReadaheadConfig
from .index import index_shards
from .source import SampleDecoder, ShardSource

__all__ = ["ImageSample", "ShardDataset"]

#: the extensions ImageFolder reads (``dataset.IMG_EXTENSIONS``, without the dot)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff", "raw")


class ShardDataset(ObjectDataset):
    """Samples of the tar shards under ``root`` (every ``*.tar`` key, sorted) or of the
    shard keys given in ``shards`` (in that order), each ``decode(sample)`` or the sample
    dict itself (``{"__key__", "__url__", extension: bytes}``, as ``webdataset``'s).

    Each shard's index is read from ``<shard>.idx`` (written by ``concurrent-loader
    pack``), or built once by scanning the shard. Each sample is one ranged GET of its
    shard; ``readahead`` reads a remote shard in aligned spans that each process keeps a
    few of, so the samples that follow in a span cost no GET (for shard order, with
    :class:`~concurrent_loader.ShardOrderSampler`; see :mod:`concurrent_loader.stores.readahead`).
    ``root`` is as for :class:`~concurrent_loader.ObjectDataset`. ``cache=`` is refused: the
    node cache keeps whole objects, not the byte ranges shards are read in.
    """

    source: ShardSource  # type: ignore[assignment]  # a different source, same protocol

    def __init__(
        self,
        root: str | os.PathLike[str] | StoreConfig,
        shards: Iterable[str] | None = None,
        *,
        decode: SampleDecoder | None = None,
        readahead: Readahead | None = None,
        fetch_config: FetchConfig | None = None,
        progress: bool = False,
        cache: str | os.PathLike[str] | CacheConfig | None = None,
    ) -> None:
        if cache is not None:
            raise ConfigError(
                "ShardDataset does not read through the node cache (cache=), which keeps whole "
                "objects, not byte ranges: use readahead=Readahead(), or copy the shards to "
                "local disk and give that directory as the root"
            )
        self.store: StoreConfig = store_config_for(root).resolved()
        self.fetch_config = fetch_config or FetchConfig()
        self.decode = decode
        self._open_nothing()
        listed: dict[str, int] = {}
        if self.store.capabilities.listing:
            with progress_bar(progress, f"listing {self.store}") as tick:
                listed = {
                    info.key: info.size
                    for info in list_store(self.store, self.fetch_config, on_object=tick)
                }
        if shards is None:
            keys = [key for key in listed if key.endswith(".tar")]
            if not keys:
                raise empty_root(self.store, f"no tar shards (*.tar) under {self.store}")
        else:
            keys = list(shards)
            if not keys:
                raise ConfigError("shards is empty")
            for key in keys:
                if listed and key not in listed:
                    raise ObjectNotFound(
                        "the shard is not under the root",
                        url=self.store.url_for(key),
                        stage="list",
                        cause=Reason.NOT_FOUND,
                    )
        sizes = [listed.get(key) for key in keys]
        with progress_bar(progress, "reading shard indexes") as tick:
            indexes = index_shards(
                self.store, self.fetch_config, keys, sizes, self._acquire, on_shard=tick
            )
        if not self.store.capabilities.remote:
            readahead = None  # shards on local disk are read in place
        self.source = ShardSource(self.store, keys, indexes, sizes, self.fetch_config, decode)
        #: the shard keys, in the order their samples are numbered, and samples per shard
        self.shards, self.shard_lengths = self.source.shards, self.source.shard_lengths
        if readahead is not None:
            self.source.store = ReadaheadConfig(
                self.store,
                {
                    key: size if size is not None else index.size
                    for key, size, index in zip(keys, sizes, indexes, strict=True)
                },
                readahead,
                {key: self.source.sample_ranges(s) for s, key in enumerate(keys)},
            )
        if len(self.source) == 0:
            message = f"the {len(keys)} shards under {self.store} hold no samples"
            raise empty_root(self.store, message, keys[0])

    _items = "samples"


class ImageSample:
    """``decode=`` for image classification shards: ``(image, label)`` from a sample with
    one image member (``.jpg``, ``.png``...) and a ``.cls`` member (the class index as
    text), as ``concurrent-loader pack --image-folder`` writes them. ``image_size`` and
    ``transform`` are as for :class:`~concurrent_loader.ImageFolder`; a sample without
    either member is a ``ShardError`` (``MissingMember``). ``decode_on`` ("cuda" or "cpu")
    ships the image bytes for the prefetcher to decode, as ``ImageFolder``'s does."""

    def __init__(
        self,
        image_size: int | tuple[int, int] | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
        label: str = "cls",
        decode_on: str | None = None,
        resize_size: int | None = None,
    ) -> None:
        self.decoder: ImageDecoder | EncodedImageDecoder = image_decoder(
            image_size, transform=transform, decode_on=decode_on, resize_size=resize_size
        )
        self.label = label

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        image = next((sample[ext] for ext in IMAGE_EXTENSIONS if ext in sample), None)
        missing = (
            ("an image member (.jpg, .png, ...)", image),
            (f"a .{self.label} member", sample.get(self.label)),
        )
        for needed, value in missing:
            if value is None:
                present = sorted(k for k in sample if not k.startswith("__"))
                raise ShardError(
                    f"the sample has no {needed}; it has {present}",
                    stage="decode",
                    cause=Reason.MISSING_MEMBER,
                )
        label = int(sample[self.label].decode("ascii").strip())
        return self.decoder(image, sample["__url__"]), label  # type: ignore[arg-type]
