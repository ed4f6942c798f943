"""Map-style datasets over objects: :class:`ObjectDataset` and :class:`ImageFolder`.

Both are ordinary ``torch.utils.data.Dataset``s: ``len(ds)`` and ``ds[i]`` work on their own
(``ds[i]`` fetches synchronously through this process's runtime), so they also work with a
stock ``DataLoader``; ``__getitems__`` fetches a whole batch concurrently. With
:class:`~concurrent_loader.ConcurrentDataLoader` they are read by the pipelined fetch ->
decode path instead, through the two hooks :meth:`ObjectDataset.open_reader` and
:meth:`ObjectDataset.decode_sample`.

A dataset holds only its configuration and key table: no client, socket, loop or resolved
credential, so it pickles to ``spawn`` workers and each process opens its own reader.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from .config import FetchConfig
from .decode import ImageDecoder
from .errors import ConfigError, LoaderError, Reason
from .fetch import CredentialSource, HttpReader, LocalReader, Reader, S3Reader
from .keys import KeyTable
from .listing import list_location
from .listing import progress as progress_bar
from .location import Location, parse_location
from .runtime import Runtime, acquire_runtime

__all__ = ["IMG_EXTENSIONS", "ImageFolder", "ObjectDataset"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ObjectDataset(Dataset[Any]):
    """Item ``i`` is ``decode(bytes of key i)``, or the raw ``bytes`` when ``decode`` is None.

    ``root`` is ``s3://bucket/prefix``, ``http(s)://host/base/`` (with ``keys``) or a local
    directory. Keys are relative to ``root`` and come from ``keys``, from a manifest
    (:meth:`from_manifest`) or from a paginated listing of the root.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        keys: Iterable[str] | None = None,
        *,
        decode: Callable[..., Any] | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        anonymous: bool = False,
        profile: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        fetch_config: FetchConfig | None = None,
        transport: str = "http1",
        progress: bool = False,
    ) -> None:
        self.location: Location = parse_location(root)
        self.endpoint_url = endpoint_url
        self.region = region
        self.fetch_config = fetch_config or FetchConfig()
        self.transport = transport
        self.credentials = CredentialSource(
            profile=profile,
            anonymous=anonymous,
            access_key=aws_access_key_id,
            secret_key=aws_secret_access_key,
            session_token=aws_session_token,
        )
        self.decode = decode
        if self.location.is_local and not os.path.isdir(self.location.prefix):
            raise ConfigError(f"no such directory: {self.location.prefix}")
        if keys is None:
            keys = self._list_keys(progress)
        self.keys = keys if isinstance(keys, KeyTable) else KeyTable(keys)
        self._runtime: Runtime | None = None
        self._runtime_lock = threading.Lock()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_manifest(
        cls,
        manifest: str | os.PathLike[str],
        root: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> ObjectDataset:
        """A dataset whose keys are the lines of ``manifest`` (a local file or an object URL),
        so a million-object dataset starts without listing. Lines are keys relative to
        ``root``; with ``root`` None, the manifest's directory is the root."""
        text = _read_manifest(manifest, kwargs)
        keys = [
            line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
        ]
        if root is None:
            root = os.path.dirname(os.fspath(manifest)) + "/"
        return cls(root, keys=keys, **kwargs)

    def _list_keys(self, show_progress: bool) -> list[str]:
        with progress_bar(show_progress, f"listing {self.location}") as tick:
            listed = list_location(
                self.location,
                endpoint_url=self.endpoint_url,
                region=self.region,
                credentials=self.credentials,
                config=self.fetch_config,
                on_object=tick,
            )
        return [obj.key for obj in listed]

    # ------------------------------------------------------------------ pipeline hooks

    def reader_key(self, config: FetchConfig | None = None) -> Hashable:
        """Readers are shared, per process, by datasets with equal keys."""
        return (
            "reader",
            self.location,
            self.endpoint_url,
            self.region,
            self.credentials,
            config or self.fetch_config,
            self.transport,
        )

    async def open_reader(self, config: FetchConfig | None = None) -> Reader:
        """Make this dataset's reader (with ``config`` instead of the dataset's, if given);
        called on the runtime's event loop."""
        config = config or self.fetch_config
        location = self.location
        if location.is_local:
            return LocalReader(location.prefix, config=config)
        if location.scheme == "s3":
            return S3Reader(
                location.bucket,
                prefix=location.prefix,
                endpoint_url=self.endpoint_url,
                region=self.region,
                credentials=self.credentials,
                config=config,
                transport=self.transport,
            )
        return HttpReader(location, config=config, transport=self.transport)

    def open_reader_blocking(self) -> LocalReader:
        """The reader of a local dataset, used from threads without an event loop."""
        if not self.location.is_local:
            raise TypeError(f"{self.location} is not a local directory")
        return LocalReader(self.location.prefix, config=self.fetch_config)

    def key_of(self, index: int) -> str:
        return self.keys[index]

    def url_for(self, index: int) -> str:
        return self.location.url_for(self.keys[index])

    def decode_sample(self, index: int, data: bytes | bytearray) -> Any:
        """Item ``index`` from its bytes (runs on a decode thread)."""
        if self.decode is None:
            return bytes(data)
        try:
            return self.decode(data)
        except LoaderError as exc:
            if exc.url is not None:
                raise
            raise exc.for_object(self.url_for(index)) from exc.__cause__

    # ------------------------------------------------------------------ plain Dataset API

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> Any:
        index = self._check_index(index)
        if self.location.is_local:
            return self.decode_sample(
                index, self.open_reader_blocking().read_blocking(self.keys[index])
            )
        runtime = self._acquire()
        data: bytes | bytearray = runtime.run(self._fetch(runtime, self.keys[index]))
        return self.decode_sample(index, data)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Fetch a batch's objects concurrently (used by a stock DataLoader)."""
        if self.location.is_local:
            return [self[i] for i in indices]
        checked = [self._check_index(i) for i in indices]
        runtime = self._acquire()

        async def fetch_all() -> list[bytes | bytearray]:
            import asyncio

            return await asyncio.gather(*(self._fetch(runtime, self.keys[i]) for i in checked))

        bodies: list[bytes | bytearray] = runtime.run(fetch_all())
        return [self.decode_sample(i, body) for i, body in zip(checked, bodies, strict=True)]

    async def _fetch(self, runtime: Runtime, key: str) -> bytes | bytearray:
        reader: Reader = await runtime.resource(self.reader_key(), self.open_reader)
        return await reader.get(key)

    def _check_index(self, index: int) -> int:
        n = len(self.keys)
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, got {type(index).__name__}")
        index = int(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} objects")
        return index

    def _acquire(self) -> Runtime:
        """This process's runtime, leased by the dataset until :meth:`close` or collection."""
        runtime = self._runtime
        if runtime is not None and not runtime.closed and runtime.pid == os.getpid():
            return runtime
        with self._runtime_lock:
            runtime = self._runtime
            if runtime is None or runtime.closed or runtime.pid != os.getpid():
                runtime = acquire_runtime()
                self._runtime = runtime
                self._finalizer = weakref.finalize(self, _release_if_current, runtime)
            return runtime

    def close(self) -> None:
        """Give back the runtime lease taken by ``ds[i]`` calls in this process. Idempotent."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        self._runtime = None

    def __enter__(self) -> ObjectDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_runtime", "_runtime_lock", "_finalizer"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runtime = None
        self._runtime_lock = threading.Lock()

    def __repr__(self) -> str:
        keys = getattr(self, "keys", None)  # absent while the constructor is still listing
        count = f"{len(keys)} objects" if keys is not None else "not listed"
        return f"{type(self).__name__}({getattr(self, 'location', '?')}, {count})"


def _release_if_current(runtime: Runtime) -> None:
    if runtime.pid == os.getpid() and not runtime.closed:
        runtime.release()


def _read_manifest(manifest: str | os.PathLike[str], kwargs: dict[str, Any]) -> str:
    text = os.fspath(manifest)
    if "://" not in text or text.startswith("file://"):
        path = text.removeprefix("file://")
        with open(path, encoding="utf-8") as f:
            return f.read()
    location = parse_location(text.rsplit("/", 1)[0] + "/")
    name = text.rsplit("/", 1)[1]
    allowed = {
        "endpoint_url",
        "region",
        "anonymous",
        "profile",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "fetch_config",
        "transport",
    }
    probe = ObjectDataset(
        location.url_for(""), [name], **{k: v for k, v in kwargs.items() if k in allowed}
    )
    try:
        data = probe[0]
    finally:
        probe.close()
    return bytes(data).decode("utf-8")


class ImageFolder(ObjectDataset):
    """torchvision's ``ImageFolder`` convention over any root: ``root/<class>/<file>``.

    Classes are the sorted first-level folder names; item ``i`` is ``(image, class_index)``.
    By default ``image`` is a uint8 CHW tensor of the whole image; ``image_size`` (int or
    (h, w)) turns on the fused decode (JPEG draft mode, resize and centre crop in one step);
    ``transform`` receives the PIL image instead (torchvision transforms work).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        image_size: int | tuple[int, int] | None = None,
        keys: Iterable[str] | None = None,
        extensions: tuple[str, ...] = IMG_EXTENSIONS,
        **kwargs: Any,
    ) -> None:
        self.decoder = ImageDecoder(image_size, transform=transform)
        self.target_transform = target_transform
        self.extensions = tuple(e.lower() for e in extensions)
        super().__init__(root, keys, decode=None, **kwargs)
        images = sorted(k for k in self.keys if "/" in k and k.lower().endswith(self.extensions))
        if not images:
            raise ConfigError(
                f"no images ({', '.join(self.extensions)}) in class folders under {self.location}",
                url=str(self.location),
                cause=Reason.EMPTY_PREFIX,
            )
        self.keys = KeyTable(images)
        self.classes = sorted({k.split("/", 1)[0] for k in images})
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = np.fromiter(
            (self.class_to_idx[k.split("/", 1)[0]] for k in images),
            dtype=np.int64,
            count=len(images),
        )

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(object URL, class index) pairs, as torchvision's ``ImageFolder.samples``."""
        return [
            (self.location.url_for(k), int(t)) for k, t in zip(self.keys, self.targets, strict=True)
        ]

    def decode_sample(self, index: int, data: bytes | bytearray) -> tuple[Any, Any]:
        image = self.decoder(data, self.location.url_for(self.keys[index]))
        target: Any = int(self.targets[index])
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
