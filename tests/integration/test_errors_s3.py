"""Errors against the real server: each fails fast, with its type and the object named,
also when raised in a worker process."""

from __future__ import annotations

import time

import pytest

from concurrent_loader import (
    AccessDenied,
    BucketNotFound,
    ConcurrentDataLoader,
    DecodeError,
    ImageFolder,
    ObjectDataset,
    ObjectNotFound,
)


@pytest.fixture()
def corrupt_object(s3_server, s3_bucket):
    key = "corrupt/train/cls/broken.jpg"
    s3_server.put_object(s3_bucket, key, b"\xff\xd8\xff\xe0 definitely not a jpeg")
    s3_server.put_object(s3_bucket, "corrupt/train/cls/fine.txt", b"ignored: not an image")
    return f"s3://{s3_bucket}/corrupt/train/"


def _attempts(error):
    """How many attempts the fetch client made before raising ``error`` (from its notes)."""
    for note in getattr(error, "__notes__", ()):
        if note.startswith("gave up after") and note.endswith("attempts"):
            return int(note.split()[3])
    return 1


def _first_batch(ds, num_workers):
    loader = ConcurrentDataLoader(ds, batch_size=2, num_workers=num_workers)
    return next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_missing_key_fails_at_once_naming_it(image_dataset, s3_env, num_workers):
    key = image_dataset.files[0][0]
    ds = ObjectDataset(image_dataset.s3_url, [key, "no/such/key.jpg"])
    with pytest.raises(ObjectNotFound) as info:
        _first_batch(ds, num_workers)
    assert _attempts(info.value) == 1  # not retried: a missing key is not transient
    assert info.value.url == image_dataset.s3_url + "no/such/key.jpg"
    assert image_dataset.s3_url + "no/such/key.jpg" in str(info.value)
    assert "NoSuchKey" in str(info.value)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_credentials_fail_fast(image_dataset, s3_env, monkeypatch, num_workers):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-wrong-secret")
    key = image_dataset.files[0][0]
    ds = ObjectDataset(image_dataset.s3_url, [key])
    with pytest.raises(AccessDenied) as info:
        _first_batch(ds, num_workers)
    assert _attempts(info.value) == 1  # not retried: refused credentials are not transient
    assert image_dataset.s3_url + key in str(info.value)
    assert "wrong-secret" not in str(info.value)


def test_bad_credentials_fail_fast_when_listing(image_dataset, s3_env, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-wrong-secret")
    started = time.monotonic()
    with pytest.raises(AccessDenied) as info:
        ImageFolder(image_dataset.s3_url)
    assert time.monotonic() - started < 10
    assert image_dataset.s3_url in str(info.value)


def test_missing_bucket_fails_fast(s3_env):
    started = time.monotonic()
    with pytest.raises(BucketNotFound) as info:
        ImageFolder("s3://no-such-bucket-here/train/")
    assert time.monotonic() - started < 10
    assert "s3://no-such-bucket-here/train/" in str(info.value)
    ds = ObjectDataset("s3://no-such-bucket-here/", ["a.jpg"])
    with pytest.raises(BucketNotFound, match="s3://no-such-bucket-here/a.jpg"):
        _first_batch(ds, 0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_jpeg_names_the_object(corrupt_object, s3_env, num_workers):
    ds = ImageFolder(corrupt_object, image_size=16)
    assert list(ds.keys) == ["cls/broken.jpg"]
    with pytest.raises(DecodeError) as info:
        _first_batch(ds, num_workers)
    assert info.value.url == corrupt_object + "cls/broken.jpg"
    assert info.value.stage == "decode"


def test_plain_getitem_errors(image_dataset, s3_env):
    ds = ObjectDataset(image_dataset.s3_url, ["missing.bin"])
    with pytest.raises(ObjectNotFound, match="missing.bin"):
        ds[0]
    with pytest.raises(IndexError):
        ds[1]
    ds.close()
