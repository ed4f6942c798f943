"""A cache that keeps each image pre-sized (``CacheConfig(presize=Presize(...))``).

In-memory stores for the cache's behaviour (the form kept, settings kept apart, a corrupted
entry re-made, a non-image refused); the real local S3 server, GETs counted at the proxy,
for ``cache warm --presize``, ``cache info`` and training through ``ImageFolder``.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import pytest
from helpers import unhedged
from PIL import Image

from concurrent_loader import ConcurrentDataLoader, ObjectDataset
from concurrent_loader.cache import CacheConfig, CachedStoreConfig, describe_cache
from concurrent_loader.cache.directory import entry_path, name_for
from concurrent_loader.cli import main
from concurrent_loader.dataset import ImageFolder
from concurrent_loader.decode.presize import Presize, is_raw, read_raw
from concurrent_loader.errors import ConfigError, DecodeError
from concurrent_loader.stores import ByteRange, S3Config
from concurrent_loader.testing.memory import MemoryConfig

from ._entries import read_entry

SMALL = Presize(24)
D = TypeVar("D", bound=ObjectDataset)
#: the datasets a test made, closed after it (a store on the local path ends when collected)
_MADE: list[ObjectDataset] = []


@pytest.fixture(autouse=True)
def _close_datasets() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()
    gc.collect()


def _made(dataset: D) -> D:
    _MADE.append(dataset)
    return dataset


def _jpeg(seed: int, width: int, height: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


def _images(count: int = 6) -> dict[str, bytes]:
    return {f"{i:02d}.jpg": _jpeg(i, 60 + 7 * i, 80 - 3 * i) for i in range(count)}


def _short_side(data: bytes | bytearray) -> int:
    if is_raw(data):
        h, w, _ = read_raw(data).shape
        return min(h, w)
    with Image.open(io.BytesIO(data)) as image:
        return min(image.size)


def _read_all(dataset: ObjectDataset) -> list[bytes]:
    return [bytes(body) for batch in ConcurrentDataLoader(dataset, batch_size=3) for body in batch]


def _entry(store: Any, key: str) -> tuple[str, str]:
    """(path, source) of ``key``'s entry in the cache of ``store`` (a CachedStoreConfig)."""
    assert isinstance(store, CachedStoreConfig)
    source = store.entry_prefix() + store.url_for(key)
    return entry_path(store.cache.directory, name_for(source)), source


def _dataset(memory: MemoryConfig, cache_dir: Any, presize: Any) -> ObjectDataset:
    cache = CacheConfig(str(cache_dir), presize=presize)
    return _made(ObjectDataset(memory, cache=cache, fetch_config=unhedged()))


def test_entries_and_every_read_hold_the_presized_form(cache_dir):
    images = _images()
    memory = MemoryConfig(dict(images))
    dataset = _dataset(memory, cache_dir, SMALL)
    expected = [SMALL.apply(images[key]) for key in sorted(images)]
    assert _read_all(dataset) == expected  # the first epoch too
    assert memory.stats.total == len(images)
    assert _read_all(dataset) == expected
    assert memory.stats.total == len(images)  # the second: no GET
    for key in images:
        path, source = _entry(dataset.store, key)
        entry = read_entry(path, source)
        assert entry is not None and bytes(entry.data) == SMALL.apply(images[key])
        assert _short_side(entry.data) == 24
    info = describe_cache(str(cache_dir))
    assert info["forms"] == [SMALL.identity]
    assert info["bytes"] < sum(len(v) for v in images.values())  # the budget counts these
    assert memory.objects == images  # the originals are never written to


def test_a_different_setting_never_serves_the_others_entries(cache_dir):
    images = _images()
    memory = MemoryConfig(dict(images))
    raw = Presize(24, format="raw")
    _read_all(_dataset(memory, cache_dir, SMALL))
    gets = memory.stats.total

    for presize, side in ((Presize(32), 32), (raw, 24), (Presize(24, quality=50), 24)):
        got = _read_all(_dataset(memory, cache_dir, presize))
        assert memory.stats.total == gets + len(images)  # all missed: GETs, not SMALL's
        gets = memory.stats.total
        assert got == [presize.apply(images[key]) for key in sorted(images)]
        assert all(_short_side(b) == side for b in got)
    assert all(is_raw(b) for b in _read_all(_dataset(memory, cache_dir, raw)))

    assert _read_all(_dataset(memory, cache_dir, None)) == [images[k] for k in sorted(images)]
    assert memory.stats.total == gets + len(images)  # the originals are an entry of their own
    assert _read_all(_dataset(memory, cache_dir, SMALL)) == [
        SMALL.apply(images[k]) for k in sorted(images)
    ]
    assert memory.stats.total == gets + len(images)  # SMALL's entries are still its own
    forms = describe_cache(str(cache_dir))["forms"]
    assert forms == [
        SMALL.identity,
        Presize(32).identity,
        raw.identity,
        Presize(24, quality=50).identity,
        "original",
    ]
    assert describe_cache(str(cache_dir))["entries"] == 5 * len(images)


def test_a_corrupted_presized_entry_is_made_again(cache_dir):
    images = _images()
    memory = MemoryConfig(dict(images))
    dataset = _dataset(memory, cache_dir, SMALL)
    _read_all(dataset)
    path, source = _entry(dataset.store, "02.jpg")
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    raw[len(raw) // 3] ^= 0xFF  # in the pre-sized image's bytes
    with open(path, "wb") as f:
        f.write(raw)

    expected = [SMALL.apply(images[key]) for key in sorted(images)]
    assert _read_all(dataset) == expected  # never the bad bytes
    assert memory.stats.total == len(images) + 1  # that one fetched again
    entry = read_entry(path, source)
    assert entry is not None and bytes(entry.data) == SMALL.apply(images["02.jpg"])
    assert _read_all(dataset) == expected
    assert memory.stats.total == len(images) + 1


def test_a_non_image_fails_its_sample_naming_it_and_is_not_cached(cache_dir):
    objects = {"good.jpg": _jpeg(1, 50, 40), "notes.jpg": b"not an image at all"}
    memory = MemoryConfig(dict(objects))
    cache = CacheConfig(str(cache_dir), presize=SMALL)
    dataset = _made(ObjectDataset(memory, keys=["notes.jpg"], cache=cache, fetch_config=unhedged()))
    for _ in range(2):
        with pytest.raises(DecodeError) as caught:
            _read_all(dataset)
        assert caught.value.url == memory.url_for("notes.jpg")
        assert memory.url_for("notes.jpg") in str(caught.value)
    assert memory.stats.total == 2  # fetched again each time: it was never cached
    path, _ = _entry(dataset.store, "notes.jpg")
    assert not os.path.exists(path)
    assert describe_cache(str(cache_dir))["entries"] == 0
    assert memory.objects == objects


def test_a_ranged_read_is_the_originals_and_bypasses_the_cache(cache_dir):
    import asyncio

    from concurrent_loader.config import FetchConfig

    images = _images(1)
    memory = MemoryConfig(dict(images))
    dataset = _dataset(memory, cache_dir, SMALL)
    _read_all(dataset)
    store = dataset.store
    assert isinstance(store, CachedStoreConfig)

    async def ranged() -> bytes:
        opened = store.open(FetchConfig())
        try:
            return bytes((await opened.get("00.jpg", ByteRange(0, 10))).data)
        finally:
            await opened.close()

    assert asyncio.run(ranged()) == images["00.jpg"][:10]


def test_a_transform_without_the_protocol_is_refused(cache_dir):
    with pytest.raises(ConfigError, match="apply"):
        CacheConfig(str(cache_dir), presize=object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- S3, the CLI


def _gets(proxy: Any) -> int:
    return int(proxy.stats()["requests_by_method"].get("GET", 0))


def _store_digests(s3_server: Any, bucket: str, keys: list[str]) -> list[str]:
    client = s3_server.client()
    try:
        return [
            hashlib.sha256(client.get_object(Bucket=bucket, Key=k)["Body"].read()).hexdigest()
            for k in keys
        ]
    finally:
        client.close()


def test_training_through_image_folder_sees_224_every_epoch_and_no_get_after_the_first(
    s3_server, s3_bucket, s3_env, proxy_factory, image_dataset, cache_dir
):
    from concurrent_loader import FetchConfig, HedgeConfig

    proxy = proxy_factory()
    presize = Presize(48)
    dataset = _made(
        ImageFolder(
            S3Config.from_url(image_dataset.s3_url, endpoint_url=proxy.endpoint_url),
            cache=CacheConfig(str(cache_dir), presize=presize),
            image_size=224,
            fetch_config=FetchConfig(hedge=HedgeConfig(enabled=False)),
        )
    )
    loader = ConcurrentDataLoader(dataset, batch_size=8, shuffle=True)
    count = len(image_dataset.files)
    for epoch in range(3):
        proxy.reset_stats()
        seen = 0
        for images, labels in loader:
            assert tuple(images.shape[1:]) == (3, 224, 224)
            seen += len(labels)
        assert seen == count
        assert _gets(proxy) == (count if epoch == 0 else 0)
    for key, _, _ in image_dataset.files:
        path, source = _entry(dataset.store, key)
        entry = read_entry(path, source)
        assert entry is not None and _short_side(entry.data) == 48
    keys = [image_dataset.prefix + key for key, _, _ in image_dataset.files]
    assert _store_digests(s3_server, s3_bucket, keys) == [d for _, _, d in image_dataset.files]


@pytest.mark.parametrize("form", ["jpeg", "raw"])
def test_cache_warm_presize_fills_with_the_form_and_info_shows_it(
    s3_server, s3_env, proxy_factory, image_dataset, cache_dir, capsys, form
):
    proxy = proxy_factory()
    root = image_dataset.s3_url
    args = ["--endpoint-url", proxy.endpoint_url, "--cache", str(cache_dir), "--no-progress"]
    presize_args = ["--presize", "40", "--format", form, "--quality", "80", "--processes", "2"]
    assert main(["cache", "warm", root, *args, *presize_args]) == 0
    err = capsys.readouterr().err
    presize = Presize(40, format=form, quality=80)
    assert f"read {len(image_dataset.files)} objects" in err and presize.identity in err

    assert main(["cache", "info", str(cache_dir)]) == 0
    assert f"forms:      {presize.identity}" in capsys.readouterr().out
    assert main(["cache", "info", str(cache_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["forms"] == [presize.identity]
    assert info["entries"] == len(image_dataset.files)

    proxy.reset_stats()
    dataset = _made(
        ObjectDataset(
            S3Config.from_url(root, endpoint_url=proxy.endpoint_url),
            keys=[key for key, _, _ in image_dataset.files],
            cache=CacheConfig(str(cache_dir), presize=presize),
        )
    )
    got = _read_all(dataset)
    assert _gets(proxy) == 0
    originals = [(image_dataset.local_root / key).read_bytes() for key, _, _ in image_dataset.files]
    assert got == [presize.apply(data) for data in originals]
    assert all(is_raw(b) == (form == "raw") for b in got)


def test_cache_warm_format_needs_presize(cache_dir, capsys):
    argv = ["cache", "warm", "s3://b/p/", "--cache", str(cache_dir), "--format", "raw"]
    assert main(argv) == 1
    assert "--presize" in capsys.readouterr().err
