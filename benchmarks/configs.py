"""The loader configurations under comparison, and how each one is built.

Every configuration yields batches ``(uint8 [B, 3, S, S], int64 [B])`` from the same
dataset with the same decode (the decoder inside ``ImageFolder``; see
:mod:`benchmarks.transform`), batch size, worker count and shuffling. They differ
only in how bytes reach the decoder, which is the thing being measured.

Builders run inside the measuring subprocess (``benchmarks.measure``), after it has pinned
itself to the client CPUs, so that DataLoader workers inherit the pinning.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import pickle
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.transform import make_decoder


@dataclass(frozen=True)
class Config:
    """One row of the comparison."""

    name: str
    title: str
    storage: str  # "s3" (through the latency proxy) or "local"
    family: str  # "stock", "ours" or "peer"


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("stock-s3", "DataLoader + boto3 (S3)", "s3", "stock"),
        Config("stock-local", "DataLoader + files (local)", "local", "stock"),
        Config("ours-s3", "ConcurrentDataLoader (S3)", "s3", "ours"),
        Config("ours-local", "ConcurrentDataLoader (local)", "local", "ours"),
        Config("s3torchconnector", "s3torchconnector S3MapDataset (S3)", "s3", "peer"),
        Config("litdata", "LitData raw streaming (S3)", "s3", "peer"),
    )
}


@dataclass(frozen=True)
class LoaderParams:
    """Everything a builder needs; sent to the measuring subprocess as JSON."""

    config: str
    batch_size: int
    workers: int
    image_size: int
    seed: int
    max_inflight_requests: int  # 0: self-tuned (None to the loader)
    endpoint_url: str  # the latency proxy in front of the S3 server
    region: str
    bucket: str
    prefix: str
    local_train_dir: str
    #: ``ours-store``: the pickled store config of any backend, base64 (``benchmarks.backends``)
    store_config: str = ""


# A built loader and a context manager that releases it.
Built = tuple[DataLoader[Any], AbstractContextManager[Any]]


def unavailable_reason(config: str) -> str | None:
    """Why ``config`` cannot run in this environment, or None when it can."""
    if config.startswith("ours"):
        try:
            from concurrent_loader import ConcurrentDataLoader, ImageFolder  # noqa: F401
        except ImportError as exc:
            return f"concurrent_loader's ConcurrentDataLoader/ImageFolder do not import: {exc}"
    if config == "s3torchconnector" and importlib.util.find_spec("s3torchconnector") is None:
        return "s3torchconnector is not installed (pip install s3torchconnector)"
    if config == "litdata":
        missing = [m for m in ("litdata", "s3fs", "zstd") if importlib.util.find_spec(m) is None]
        if missing:
            return (
                f"not installed ({', '.join(missing)}): a plain `pip install litdata` replaces "
                "this environment's torch (its torchvision dependency resolves to a newer "
                "torch); to run it: pip install litdata s3fs zstd 'torch==<installed version>'"
            )
    return None


class _LabelIndex:
    """Maps a class directory name to its index in sorted order, as ImageFolder does."""

    def __init__(self, classes: Iterable[str]) -> None:
        self.classes = sorted(set(classes))
        self.index = {name: i for i, name in enumerate(self.classes)}

    def __call__(self, key: str) -> int:
        return self.index[key.rsplit("/", 2)[-2]]


class Boto3ImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """What users write today: one blocking ``get_object`` per item.

    The client is created lazily in each process, because a boto3 client must not cross a
    fork; it is rebuilt when the pid changes.
    """

    def __init__(self, params: LoaderParams) -> None:
        import boto3

        self.params = params
        self.decode = make_decoder(params.image_size)
        client = boto3.client("s3", endpoint_url=params.endpoint_url, region_name=params.region)
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=params.bucket, Prefix=params.prefix
        ):
            keys.extend(o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".JPEG"))
        self.keys = sorted(keys)
        self.label_of = _LabelIndex(k.rsplit("/", 2)[-2] for k in self.keys)
        self._client: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.keys)

    def _s3(self) -> Any:
        if self._pid != os.getpid():
            import boto3

            self._client = boto3.client(
                "s3", endpoint_url=self.params.endpoint_url, region_name=self.params.region
            )
            self._pid = os.getpid()
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"], state["_pid"] = None, -1
        return state

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        key = self.keys[index]
        body = self._s3().get_object(Bucket=self.params.bucket, Key=key)["Body"].read()
        return self.decode(body), self.label_of(key)


class FileImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """The local-disk baseline: read the file, decode it."""

    def __init__(self, params: LoaderParams) -> None:
        self.decode = make_decoder(params.image_size)
        paths: list[str] = []
        for entry in sorted(os.scandir(params.local_train_dir), key=lambda e: e.name):
            if entry.is_dir():
                paths.extend(sorted(f.path for f in os.scandir(entry.path) if f.is_file()))
        self.paths = paths
        self.label_of = _LabelIndex(p.rsplit("/", 2)[-2] for p in paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path = self.paths[index]
        with open(path, "rb") as f:
            data = f.read()
        return self.decode(data), self.label_of(path)


class _S3ReaderTransform:
    """s3torchconnector hands the transform a reader; read it whole and decode."""

    def __init__(self, image_size: int, classes: Iterable[str]) -> None:
        self.decode = make_decoder(image_size)
        self.label_of = _LabelIndex(classes)

    def __call__(self, reader: Any) -> tuple[torch.Tensor, int]:
        return self.decode(reader.read()), self.label_of(reader.key)


def _stock_loader(dataset: Dataset[Any], params: LoaderParams) -> Built:
    loader = DataLoader(
        dataset,
        batch_size=params.batch_size,
        shuffle=True,
        num_workers=params.workers,
        generator=torch.Generator().manual_seed(params.seed),
    )
    return loader, nullcontext()


def _build_stock_s3(params: LoaderParams) -> Built:
    return _stock_loader(Boto3ImageDataset(params), params)


def _build_stock_local(params: LoaderParams) -> Built:
    return _stock_loader(FileImageDataset(params), params)


def _build_ours(params: LoaderParams, source: Any) -> Built:
    from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder

    # 0: the self-tuned default (benchmarks.run's "auto")
    fetch_config = FetchConfig(max_inflight_requests=params.max_inflight_requests or None)
    dataset = ImageFolder(source, image_size=params.image_size, fetch_config=fetch_config)
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=params.batch_size,
        shuffle=True,
        num_workers=params.workers,
        generator=torch.Generator().manual_seed(params.seed),
    )
    closer = loader if isinstance(loader, AbstractContextManager) else nullcontext()
    return loader, closer


def _build_ours_s3(params: LoaderParams) -> Built:
    from concurrent_loader.stores import S3Config

    source = S3Config.from_url(
        f"s3://{params.bucket}/{params.prefix}", endpoint_url=params.endpoint_url
    )
    return _build_ours(params, source)


def _build_ours_store(params: LoaderParams) -> Built:
    return _build_ours(params, pickle.loads(base64.b64decode(params.store_config)))


def _build_ours_local(params: LoaderParams) -> Built:
    return _build_ours(params, params.local_train_dir)


def _build_s3torchconnector(params: LoaderParams) -> Built:
    from s3torchconnector import S3ClientConfig, S3MapDataset

    classes = sorted(e.name for e in os.scandir(params.local_train_dir) if e.is_dir())
    dataset = S3MapDataset.from_prefix(
        f"s3://{params.bucket}/{params.prefix}",
        region=params.region,
        endpoint=params.endpoint_url,
        transform=_S3ReaderTransform(params.image_size, classes),
        # S3-compatible servers on an IP address need path-style URLs.
        s3client_config=S3ClientConfig(force_path_style=True),
    )
    return _stock_loader(dataset, params)


class LitDataImages(Dataset[tuple[torch.Tensor, int]]):
    """LitData's ``StreamingRawDataset`` with labels from the object keys.

    LitData downloads a batch's objects concurrently in ``__getitems__`` and runs its
    ``transform`` (here the shared decoder) on a thread as each object arrives; this wrapper
    only pairs each decoded image with the class of its key.
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        paths = [item.path for item in raw.items]
        self.label_of = _LabelIndex(p.rsplit("/", 2)[-2] for p in paths)
        self.labels = [self.label_of(p) for p in paths]

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.raw[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        images = self.raw.__getitems__(indices)
        return [(image, self.labels[i]) for image, i in zip(images, indices, strict=True)]


def _build_litdata(params: LoaderParams) -> Built:
    import tempfile

    import litdata.streaming.downloader as litdata_downloader
    from litdata import StreamingRawDataset
    from litdata.raw.indexer import FileIndexer

    # The local server speaks plain HTTP, which LitData's obstore client options do not
    # allow (real S3 is HTTPS); allowing it changes nothing else.
    options = getattr(litdata_downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict):
        options["allow_http"] = "true"

    class ListOnlyIndexer(FileIndexer):  # type: ignore[misc]
        """Lists the prefix every run and never writes its index into the dataset prefix
        (by default LitData uploads ``index.json.zstd`` beside the images, which other
        loaders would then list as a sample)."""

        def _upload_to_cloud(self, *args: Any, **kwargs: Any) -> None:
            return None

    cache = tempfile.TemporaryDirectory(prefix="bench-litdata-")
    raw = StreamingRawDataset(
        f"s3://{params.bucket}/{params.prefix}",
        cache_dir=cache.name,
        indexer=ListOnlyIndexer(),
        storage_options={"endpoint_url": params.endpoint_url},
        recompute_index=True,
        transform=make_decoder(params.image_size),
    )
    loader, _ = _stock_loader(LitDataImages(raw), params)
    return loader, cache


BUILDERS: dict[str, Callable[[LoaderParams], Built]] = {
    "stock-s3": _build_stock_s3,
    "stock-local": _build_stock_local,
    "ours-s3": _build_ours_s3,
    "ours-local": _build_ours_local,
    "ours-store": _build_ours_store,
    "s3torchconnector": _build_s3torchconnector,
    "litdata": _build_litdata,
}
