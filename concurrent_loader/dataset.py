"""Map-style datasets over objects: :class:`ObjectDataset` and :class:`ImageFolder`.

Both are ordinary ``Dataset``s (``ds[i]`` fetches synchronously, ``__getitems__`` a batch
concurrently), so a stock ``DataLoader`` works too; ``ConcurrentDataLoader`` reads them
through their ``source`` (:mod:`concurrent_loader.sources`) instead. A dataset holds
configuration and nothing open, so it pickles to ``spawn`` workers and each process opens
its own client.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from .cache import CacheConfig, CachedStoreConfig, with_cache
from .closing import Closing
from .config import FetchConfig
from .decode import EncodedImageDecoder, ImageDecoder, image_decoder
from .errors import ConfigError
from .fetch import client_for
from .fetch.parts import PartsConfig
from .finish import later
from .keys import MAGIC, KeyTable, parse_manifest_text
from .keys.folders import image_folder
from .listing import empty_root, list_store
from .listing import progress as progress_bar
from .runtime import Runtime, acquire_runtime
from .sources import CallDecoder, ObjectDecoder, ObjectSource
from .sources.load import load_samples
from .stores import StoreConfig, store_config_for
from .stores.base import BlockingStore

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "ObjectDataset"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ObjectDataset(Closing, Dataset[Any]):
    """Item ``i`` is ``decode(bytes of key i)``, or the raw ``bytes`` when ``decode`` is None.

    ``root`` is ``s3://bucket/prefix``, ``http(s)://host/base/`` (with ``keys``), a local
    directory, or a store config: a backend's options are its config, given as the root
    (``S3Config.from_url("s3://bucket/prefix", endpoint_url=...)``); a URL gets its
    backend's defaults (botocore's chain for S3). Keys are relative to ``root``: ``keys``, a
    manifest (:meth:`from_manifest`) or a listing of the root. ``cache``: a node-local cache
    directory or ``CacheConfig``. ``fetch_config`` (requests and bytes in flight, timeouts,
    retries, hedges) and ``parts`` (ranged GETs for a large read) say how bytes are fetched.
    """

    parts: PartsConfig = PartsConfig()

    def __init__(
        self,
        root: str | os.PathLike[str] | StoreConfig,
        keys: Iterable[str] | None = None,
        *,
        decode: Callable[..., Any] | None = None,
        fetch_config: FetchConfig | None = None,
        progress: bool = False,
        cache: str | os.PathLike[str] | CacheConfig | None = None,
        parts: PartsConfig | None = None,
    ) -> None:
        if parts is not None and not isinstance(parts, PartsConfig):
            raise ConfigError(f"parts must be a PartsConfig, got {type(parts).__name__}")
        self.parts = parts or PartsConfig()
        store = store_config_for(root).resolved()
        self.store: StoreConfig = with_cache(store, cache, client_for)
        self.fetch_config = fetch_config or FetchConfig()
        self.decode = decode
        if keys is None:
            with progress_bar(progress, f"listing {self.store}") as tick:
                listed = list_store(self.store, self.fetch_config, on_object=tick)
            sizes = np.fromiter((info.size for info in listed), dtype=np.int64, count=len(listed))
            keys = KeyTable((info.key for info in listed), {"sizes": sizes})
        # The table lives in a segment every worker maps; this dataset holds it until close().
        self.keys = self._select(keys if isinstance(keys, KeyTable) else KeyTable(keys)).acquire()
        self._holds_keys = True
        if isinstance(self.store, CachedStoreConfig):  # it tells when it holds all of them
            self.store = self.store.for_keys(self.keys)
        self.source = ObjectSource(self.store, self.keys, self._decoder(), self.fetch_config)
        self._open_nothing()

    def _open_nothing(self) -> None:
        # What ``ds[i]`` opens in a process (kept until close()): never pickled or forked.
        self._runtime: Runtime | None = None
        self._runtime_lock = threading.Lock()
        self._blocking: tuple[int, BlockingStore] | None = None  # (pid, open store)

    def _select(self, keys: KeyTable) -> KeyTable:
        return keys

    def _decoder(self) -> ObjectDecoder:
        return CallDecoder(self.decode)

    @classmethod
    def from_manifest(
        cls,
        manifest: str | os.PathLike[str],
        root: str | os.PathLike[str] | StoreConfig | None = None,
        **kwargs: Any,
    ) -> ObjectDataset:
        """A dataset whose keys are those of ``manifest`` (a local file or an object URL):
        keys relative to ``root`` (default: the manifest's directory). A text manifest is
        split on ``\\n`` only (a trailing ``\\r`` dropped), blank and ``#`` lines skipped; a
        binary one (``concurrent-loader manifest`` writes it beside the text, ``.bin``) also
        holds the objects' sizes and loads without parsing. A remote manifest on ``root``'s
        backend is read with its options."""
        base = store_config_for(root) if root is not None else None
        data = _read_manifest(manifest, base, kwargs.get("fetch_config") or FetchConfig())
        try:
            keys = KeyTable.load(data) if data.startswith(MAGIC) else parse_manifest_text(data)
        except ValueError as exc:  # UnicodeDecodeError too
            raise ConfigError(f"the manifest {os.fspath(manifest)} cannot be read: {exc}") from exc
        if base is None:
            base = store_config_for(os.path.dirname(os.fspath(manifest)) + "/")
        return cls(base, keys=keys, **kwargs)

    def url_for(self, index: int) -> str:
        return self.source.url_for(index)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        indices = [self._check_index(i) for i in indices]
        return load_samples(self.source, indices, self._acquire, self._blocking_store)

    _items = "objects"

    def _check_index(self, index: int) -> int:
        n = len(self)
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, got {type(index).__name__}")
        index = int(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} {self._items}")
        return index

    def _acquire(self) -> Runtime:
        """This process's runtime, leased by the dataset until :meth:`close` or collection."""
        with self._runtime_lock:
            runtime = self._runtime
            if runtime is None or runtime.closed or runtime.pid != os.getpid():
                runtime = acquire_runtime()
                self._runtime = runtime
                self._finalizer = weakref.finalize(self, _release_later, runtime)
            return runtime

    def _blocking_store(self) -> BlockingStore:
        """This process's open store for local reads, kept until :meth:`close` (opening one
        per ``ds[i]`` would cost more than the read)."""
        with self._runtime_lock:
            opened = self._blocking
            if opened is None or opened[0] != os.getpid():
                store: BlockingStore = self.source.store.open(self.source.fetch_config)  # type: ignore[assignment]
                opened = self._blocking = (os.getpid(), store)
        return opened[1]

    def close(self) -> None:
        """Give back what ``ds[i]`` calls opened in this process, and this dataset's hold on
        its key table (unlinked when no dataset of the creating process holds it: workers
        started afterwards cannot map it). Idempotent."""
        finalizer = getattr(self, "_finalizer", None)
        detached = finalizer.detach() if finalizer is not None else None
        if detached is not None:  # returned here and now, not by the finalizer
            _release_if_current(*detached[2])
        self._open_nothing()
        if getattr(self, "_holds_keys", False):
            self._holds_keys = False
            self.keys.release()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_runtime", "_runtime_lock", "_finalizer", "_blocking"):
            state.pop(name, None)
        state["_holds_keys"] = False  # a copy in another process maps the table, never owns it
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_nothing()

    def __repr__(self) -> str:
        source = getattr(self, "source", None)  # absent while the constructor is still listing
        count = f"{len(source)} {self._items}" if source is not None else "not listed"
        return f"{type(self).__name__}({getattr(self, 'store', '?')}, {count})"


def _release_if_current(runtime: Runtime) -> None:
    if runtime.pid == os.getpid() and not runtime.closed:
        runtime.release()


def _release_later(runtime: Runtime) -> None:
    # A finalizer: on whatever thread collects the dataset (see concurrent_loader.finish).
    if runtime.pid == os.getpid() and not runtime.closed:
        later(functools.partial(_release_if_current, runtime))


def _read_manifest(
    manifest: str | os.PathLike[str], root: StoreConfig | None, config: FetchConfig
) -> bytes:
    text = os.fspath(manifest)
    if "://" not in text or text.startswith("file://"):
        with open(text.removeprefix("file://"), "rb") as f:
            return f.read()
    parent, name = text.rsplit("/", 1)
    store = store_config_for(parent + "/")
    if type(store) is type(root) and hasattr(root, "with_root"):  # the root's options
        store = root.with_root(parent + "/")  # (an Azure root's account, endpoint and key)
    with ObjectDataset(store, keys=[name], fetch_config=config) as manifest_object:
        return bytes(manifest_object[0])


@dataclass(eq=False)
class _ImageFolderDecoder:
    decoder: ImageDecoder | EncodedImageDecoder
    keys: KeyTable  # its "targets" column: a worker maps it, nothing is pickled
    target_transform: Callable[[int], Any] | None

    def __call__(self, index: int, data: bytes | bytearray, url: str) -> tuple[Any, Any]:
        image = self.decoder(data, url)
        target: Any = int(self.keys.column("targets")[index])  # type: ignore[index]
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class ImageFolder(ObjectDataset):
    """torchvision's ``ImageFolder`` convention over any root: ``root/<class>/<file>``.

    Classes are the sorted first-level folder names; item ``i`` is ``(image, class_index)``,
    ``image`` a uint8 CHW tensor; ``image_size`` (int or (h, w)) turns on the fused decode
    (JPEG draft mode, resize and centre crop in one step), with ``resize_size=R``
    torchvision's ``Resize(R)`` + ``CenterCrop(image_size)``; ``transform`` receives the PIL
    image instead. ``decode_on="cuda"`` (needs ``image_size``, no ``transform``) ships each
    image's bytes undecoded, as an ``EncodedImage``, for ``CUDAPrefetcher`` to decode each
    batch on the GPU in one call (``"cpu"``: by Pillow on its thread, for tests).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | StoreConfig,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        image_size: int | tuple[int, int] | None = None,
        keys: Iterable[str] | None = None,
        extensions: tuple[str, ...] = IMG_EXTENSIONS,
        decode_on: str | None = None,
        resize_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.decoder: ImageDecoder | EncodedImageDecoder = image_decoder(
            image_size, transform=transform, decode_on=decode_on, resize_size=resize_size
        )
        self.target_transform = target_transform
        self.extensions = tuple(e.lower() for e in extensions)
        super().__init__(root, keys, decode=None, **kwargs)

    def _select(self, keys: KeyTable) -> KeyTable:
        found = image_folder(keys, self.extensions)  # None: unsorted keys, the slow path
        picks, targets, self.classes = found if found is not None else self._sorted(keys)
        if len(picks) == 0:
            found_none = f"no images ({', '.join(self.extensions)}) in class folders"
            raise empty_root(self.store, f"{found_none} under {self.store}")
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        if found is not None:
            return keys.subset(picks, {"targets": targets})
        sizes = keys.column("sizes")
        columns = {"targets": targets} | ({} if sizes is None else {"sizes": sizes[picks]})
        return KeyTable((keys[int(i)] for i in picks), columns)

    def _sorted(self, keys: KeyTable) -> tuple[np.ndarray, np.ndarray, list[str]]:
        chosen = sorted(
            (key, i)
            for i, key in enumerate(keys)
            if "/" in key and key.lower().endswith(self.extensions)
        )
        classes = sorted({key.split("/", 1)[0] for key, _ in chosen})
        rank = {name: i for i, name in enumerate(classes)}
        picks = np.array([i for _, i in chosen], dtype=np.int64)
        targets = np.array([rank[key.split("/", 1)[0]] for key, _ in chosen], dtype=np.int64)
        return picks, targets, classes

    @property
    def targets(self) -> np.ndarray:
        """The class index of each image (in the shared key table)."""
        targets = self.keys.column("targets")
        assert targets is not None  # every ImageFolder table has them
        return targets

    def _decoder(self) -> ObjectDecoder:
        return _ImageFolderDecoder(self.decoder, self.keys, self.target_transform)

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(object URL, class index) pairs, as torchvision's ``ImageFolder.samples``."""
        return [
            (self.store.url_for(k), int(t)) for k, t in zip(self.keys, self.targets, strict=True)
        ]
