"""``on_error="skip"``: failing samples are left out, reported by URL and marked on their
batch, within a per-epoch budget; bugs in user code are never skipped."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from concurrent_loader import (
    ConcurrentDataLoader,
    ConfigError,
    DecodeError,
    ImageFolder,
    LoaderError,
    ObjectDataset,
    ObjectNotFound,
    SkipBudgetExceeded,
    SkippedSample,
    is_partial,
)
from concurrent_loader.decode import ImageDecoder

from ._support import expected_batches, sha256_hex, upload_objects

PREFIX = "skip/"
COUNT = 24
KEYS = [f"{'a' if i < 12 else 'b'}/{i:03d}.jpg" for i in range(COUNT)]
# Index -> what is wrong with that object; every other index is a good JPEG.
BAD = {3: "empty", 6: "missing", 7: "text", 13: "truncated", 14: "missing", 15: "text"}
# Batches drawn so that batch 0 loses one sample, batch 1 two, batch 3 all of its own.
BATCHES = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [13, 14, 15], [12, 16, 17, 18], [19, 20]]
EXPECTED_ERROR = {"empty": DecodeError, "text": DecodeError, "truncated": DecodeError}


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def skip_images(tmp_path_factory, s3_server, reliability_bucket):
    """(dataset root URL, {index: reference image tensor} for the good images)."""
    bodies, references = {}, {}
    for i, key in enumerate(KEYS):
        good = _jpeg(i)
        kind = BAD.get(i)
        if kind is None:
            bodies[key] = good
            references[i] = ImageDecoder()(good)
        elif kind == "empty":
            bodies[key] = b""
        elif kind == "text":
            bodies[key] = b"not an image at all\n" * 10
        elif kind == "truncated":
            bodies[key] = good[: len(good) // 2]
        # "missing": listed in the keys, never uploaded
    stored = upload_objects(
        s3_server, reliability_bucket, PREFIX, bodies, tmp_path_factory.mktemp("reliability_skip")
    )
    return stored.url, references


def _dataset(root: str) -> ImageFolder:
    ds = ImageFolder(root, keys=KEYS)
    assert list(ds.keys) == KEYS
    return ds


def _url(root: str, index: int) -> str:
    return root + KEYS[index]


def _check_batch(batch, indices, root, references) -> None:
    """``batch`` holds exactly the good samples of ``indices``, in order, and, if any
    sample of ``indices`` is bad, is marked with exactly those, in order."""
    good = [i for i in indices if i not in BAD]
    bad = [i for i in indices if i in BAD]
    images, labels = batch
    assert isinstance(batch, list), type(batch)  # still what a full batch is
    assert len(images) == len(labels) == len(good), "a short batch that does not say why"
    for image, label, i in zip(images, labels, good, strict=True):
        assert torch.equal(image, references[i]), f"sample {i} is not {KEYS[i]}"
        assert label.item() == (0 if i < 12 else 1)
    assert is_partial(batch) == bool(bad)
    if bad:
        _check_skipped(batch.skipped, bad, root)


def _check_skipped(skipped, indices, root) -> None:
    assert [s.index for s in skipped] == indices
    for sample, i in zip(skipped, indices, strict=True):
        assert isinstance(sample, SkippedSample)
        assert sample.url == _url(root, i)
        assert isinstance(sample.error, LoaderError)
        assert isinstance(sample.error, EXPECTED_ERROR.get(BAD[i], ObjectNotFound)), sample.error
        assert sample.error.url == sample.url


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipped_samples_are_reported_and_their_batches_marked(
    skip_images, s3_env, caplog, num_workers
):
    root, references = skip_images
    caplog.set_level(logging.WARNING)
    loader = ConcurrentDataLoader(
        _dataset(root),
        batch_sampler=BATCHES,
        num_workers=num_workers,
        on_error="skip",
        max_skipped=len(BAD),  # exactly the budget: allowed
    )
    got = list(loader)
    # Batch 3 lost every sample: it is not yielded, but its samples are listed.
    yielded = [b for b in BATCHES if any(i not in BAD for i in b)]
    assert len(got) == len(yielded) == len(BATCHES) - 1
    for batch, indices in zip(got, yielded, strict=True):
        _check_batch(batch, indices, root, references)
    bad = [i for b in BATCHES for i in b if i in BAD]
    _check_skipped(loader.skipped, bad, root)
    assert loader.stats()["skipped"] == len(BAD)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for i in bad:
        assert any(_url(root, i) in message for message in warned), f"no warning for {i}"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_no_silent_short_batch_when_shuffled(skip_images, s3_env, num_workers):
    root, references = skip_images
    loader = ConcurrentDataLoader(
        _dataset(root),
        batch_size=5,
        shuffle=True,
        generator=torch.Generator().manual_seed(5),
        num_workers=num_workers,
        on_error="skip",
        max_skipped=0.25,
    )
    got = list(loader)
    planned = expected_batches(COUNT, 5, seed=5)
    yielded = [b for b in planned if any(i not in BAD for i in b)]
    assert len(got) == len(yielded)
    for position, (batch, indices) in enumerate(zip(got, yielded, strict=True)):
        _check_batch(batch, indices, root, references)
        if position < len(got) - 1 and len(batch[0]) < 5:
            assert is_partial(batch), f"batch {position} is short and unmarked"
    assert any(is_partial(batch) for batch in got)
    assert sorted(s.index for s in loader.skipped) == sorted(BAD)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_count_budget_is_enforced(skip_images, s3_env, num_workers):
    root, references = skip_images
    loader = ConcurrentDataLoader(
        _dataset(root),
        batch_sampler=BATCHES,
        num_workers=num_workers,
        on_error="skip",
        max_skipped=len(BAD) - 1,
    )
    got = []
    with pytest.raises(SkipBudgetExceeded) as info:
        for batch in loader:
            got.append(batch)
    # Batches 0-2 skip three samples; batch 3 (all bad) brings the count to 6 > 5.
    assert len(got) == 3
    for batch, indices in zip(got, BATCHES[:3], strict=True):
        _check_batch(batch, indices, root, references)
    error = info.value
    last = _url(root, 15)
    assert error.url == last
    assert last in str(error)
    assert "6 samples" in str(error), str(error)
    assert isinstance(error.__cause__, LoaderError) and error.__cause__.url == last


@pytest.mark.parametrize("num_workers", [0, 2])
def test_zero_budget_fails_on_the_first_skip(skip_images, s3_env, num_workers):
    root, _ = skip_images
    loader = ConcurrentDataLoader(
        _dataset(root),
        batch_sampler=BATCHES,
        num_workers=num_workers,
        on_error="skip",
        max_skipped=0,
    )
    with pytest.raises(SkipBudgetExceeded) as info:
        next(iter(loader))
    assert info.value.url == _url(root, 3)


@pytest.mark.parametrize("fraction, fails", [(0.2, True), (0.25, False)])
def test_fraction_budget_is_a_share_of_the_epoch(skip_images, s3_env, fraction, fails):
    root, _ = skip_images
    # 6 of 24 samples fail: 0.25 allows 6, 0.2 allows 4.8.
    loader = ConcurrentDataLoader(
        _dataset(root), batch_size=4, on_error="skip", max_skipped=fraction
    )
    if fails:
        with pytest.raises(SkipBudgetExceeded):
            list(loader)
    else:
        assert sum(len(images) for images, _ in loader) == COUNT - len(BAD)
        assert len(loader.skipped) == len(BAD)


def test_budget_and_report_restart_every_epoch(skip_images, s3_env):
    root, _ = skip_images
    loader = ConcurrentDataLoader(
        _dataset(root), batch_size=4, num_workers=2, on_error="skip", max_skipped=len(BAD)
    )
    for _epoch in range(2):
        assert sum(len(images) for images, _ in loader) == COUNT - len(BAD)
        assert sorted(s.index for s in loader.skipped) == sorted(BAD)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_what_a_user_decode_raises_is_a_decode_error_under_the_policy(
    small_objects, s3_env, num_workers
):
    broken = small_objects.digests[5]

    def decode(data):
        digest = sha256_hex(data)
        if digest == broken:
            raise ValueError("not a sample")
        return digest

    ds = ObjectDataset(small_objects.url, small_objects.keys[:16], decode=decode)
    with pytest.raises(DecodeError, match="ValueError: not a sample") as caught:
        list(ConcurrentDataLoader(ds, batch_size=4, num_workers=num_workers))
    assert caught.value.url == f"{small_objects.url}{small_objects.keys[5]}"

    loader = ConcurrentDataLoader(
        ds, batch_size=4, num_workers=num_workers, on_error="skip", max_skipped=0.9
    )
    assert sum(len(batch) for batch in loader) == 15
    assert [s.index for s in loader.skipped] == [5]

    def always_fails(data):
        raise NameError("a bug in user code")

    # A decode that never works ends the epoch at the skip budget, with its cause.
    failing = ObjectDataset(small_objects.url, small_objects.keys[:16], decode=always_fails)
    with pytest.raises(SkipBudgetExceeded) as caught_budget:
        list(ConcurrentDataLoader(failing, batch_size=4, num_workers=num_workers, on_error="skip"))
    assert isinstance(caught_budget.value.__cause__, DecodeError)
    assert "NameError" in str(caught_budget.value.__cause__)


def test_dict_batches_are_marked(small_objects, s3_env):
    keys = small_objects.keys[:6]
    keys[2] = "no/such/object.bin"
    ds = ObjectDataset(
        small_objects.url,
        keys,
        decode=lambda data: {"digest": sha256_hex(data), "size": len(data)},
    )
    loader = ConcurrentDataLoader(ds, batch_size=3, on_error="skip", max_skipped=1)
    first, second = list(loader)
    assert isinstance(first, dict) and is_partial(first)
    assert first["digest"] == [small_objects.digests[0], small_objects.digests[1]]
    assert len(first["size"]) == 2
    assert [(s.index, s.url) for s in first.skipped] == [(2, ds.url_for(2))]
    assert isinstance(first.skipped[0].error, ObjectNotFound)
    assert isinstance(second, dict) and not is_partial(second)


def test_skip_names_the_object_when_the_decoder_does_not(small_objects, s3_env):
    # The library's own decoder, used directly, does not know which object it decodes.
    keys = small_objects.keys[:4]
    ds = ObjectDataset(small_objects.url, keys, decode=ImageDecoder(16))
    loader = ConcurrentDataLoader(ds, batch_size=4, on_error="skip", max_skipped=4)
    assert list(loader) == []  # random bytes: no sample decodes
    assert [s.url for s in loader.skipped] == [ds.url_for(i) for i in range(4)]
    assert all(isinstance(s.error, DecodeError) for s in loader.skipped)


@pytest.mark.parametrize(
    "options",
    [
        {"on_error": "ignore"},
        {"on_error": "skip", "max_skipped": -1},
        {"on_error": "skip", "max_skipped": 1.0},
        {"on_error": "skip", "max_skipped": 1.5},
    ],
)
def test_bad_skip_options_fail_at_construction(options):
    ds = ObjectDataset("s3://bucket/prefix/", ["a.bin", "b.bin"])
    with pytest.raises(ConfigError):
        ConcurrentDataLoader(ds, batch_size=2, **options)
