"""Bad input fails within seconds with an error that names it, also from worker processes.

Covered elsewhere (tests/integration/test_errors_s3.py) and not repeated here: a missing
key (0 and 2 workers), a wrong secret (0 and 2 workers, and when listing), a missing
bucket (listing, and fetching with 0 workers), a corrupt JPEG header.
"""

from __future__ import annotations

import gc
import io
import time

import numpy as np
import pytest
from PIL import Image

from concurrent_loader import (
    AccessDenied,
    BucketNotFound,
    ConcurrentDataLoader,
    ConfigError,
    DecodeError,
    FetchConfig,
    ImageFolder,
    ObjectDataset,
    ObjectTooLarge,
)
from concurrent_loader.stores import S3Config

from ._support import upload_objects

PREFIX = "bad/"
LARGE_SIZE = 64 * 1024
FAST = 10.0  # seconds: "fails within seconds", with room for a loaded machine


def _jpeg(seed: int, size: int = 64) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


GOOD_JPEG = _jpeg(1)
BAD_IMAGES = {
    "empty": b"",
    "truncated": GOOD_JPEG[: len(GOOD_JPEG) // 2],
    "text": b"this is a plain text file, not an image\n" * 20,
}


@pytest.fixture(scope="module")
def bad_objects(tmp_path_factory, s3_server, reliability_bucket):
    bodies = {f"img/cls/{name}.jpg": data for name, data in BAD_IMAGES.items()}
    bodies["img/cls/good.jpg"] = GOOD_JPEG
    bodies["large/large.bin"] = bytes(LARGE_SIZE)
    bodies["notimages/cls/readme.txt"] = b"no images in this folder\n"
    root = tmp_path_factory.mktemp("reliability_bad")
    return upload_objects(s3_server, reliability_bucket, PREFIX, bodies, root)


def _first_batch(ds, num_workers: int, **kwargs):
    return next(iter(ConcurrentDataLoader(ds, batch_size=1, num_workers=num_workers, **kwargs)))


def _fails_fast(expected, ds, num_workers: int, **kwargs):
    started = time.monotonic()
    with pytest.raises(expected) as info:
        _first_batch(ds, num_workers, **kwargs)
    elapsed = time.monotonic() - started
    error = info.value
    # Only the error's type, message and attributes matter here. Its traceback may keep
    # the loader's iterator (and its workers) alive: drop it now, so that whatever its
    # shutdown costs is paid in this test, not the next one (test_shutdown.py checks it).
    error.__traceback__ = None
    del info
    gc.collect()
    assert elapsed < FAST, f"took {elapsed:.1f} s to fail"
    # The original exception object, not one that torch re-created from its text.
    assert "in DataLoader worker process" not in str(error), str(error)
    return error


# ---------------------------------------------------------------------------- bad objects


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "name, image_size, cause",
    [
        ("empty", None, "EmptyObject"),
        ("truncated", None, None),
        ("truncated", 16, None),
        ("text", None, "Undecodable"),
    ],
)
def test_bad_image_fails_with_decode_error_naming_it(
    bad_objects, s3_env, name, image_size, cause, num_workers
):
    key = f"cls/{name}.jpg"
    url = f"{bad_objects.url}img/{key}"
    ds = ImageFolder(bad_objects.url + "img/", keys=[key], image_size=image_size)
    error = _fails_fast(DecodeError, ds, num_workers)
    assert error.url == url
    assert error.stage == "decode"
    assert url in str(error)
    if cause is not None:
        assert error.cause == cause
    # The same loader reads a good image from the same folder: the bytes are the problem.
    good = ImageFolder(bad_objects.url + "img/", keys=["cls/good.jpg"], image_size=image_size)
    images, labels = _first_batch(good, num_workers)
    assert images.shape[0] == 1 and labels.tolist() == [0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_object_larger_than_max_object_bytes(bad_objects, s3_env, num_workers):
    url = bad_objects.url + "large/large.bin"
    ds = ObjectDataset(
        bad_objects.url, ["large/large.bin"], fetch_config=FetchConfig(max_object_bytes=1024)
    )
    error = _fails_fast(ObjectTooLarge, ds, num_workers)
    assert error.url == url
    assert url in str(error)
    # Exactly at the limit is allowed.
    exact = ObjectDataset(
        bad_objects.url, ["large/large.bin"], fetch_config=FetchConfig(max_object_bytes=LARGE_SIZE)
    )
    assert len(_first_batch(exact, num_workers)[0]) == LARGE_SIZE


@pytest.mark.parametrize("num_workers", [0, 2])
def test_user_decode_bug_names_the_object(bad_objects, s3_env, num_workers):
    def decode(data):
        raise ValueError("bug in the user's decode function")

    url = bad_objects.url + "img/cls/good.jpg"
    ds = ObjectDataset(bad_objects.url, ["img/cls/good.jpg"], decode=decode)
    # A DecodeError naming the object, with the user's exception in its message and cause.
    error = _fails_fast(DecodeError, ds, num_workers)
    assert error.url == url and error.stage == "decode"
    assert "ValueError: bug in the user's decode function" in str(error)


# ---------------------------------------------------------------------------- bad roots


@pytest.mark.parametrize(
    "root",
    [
        "s3://",
        "s3:///prefix/",
        "s3://user@bucket/prefix/",
        "s3://bucket:9000/prefix/",
        "http:///no/host/",
        "https://",
    ],
)
def test_malformed_url_is_a_config_error_naming_it(root):
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        ObjectDataset(root, ["a.bin"])
    assert time.monotonic() - started < FAST
    assert isinstance(info.value, ValueError)
    assert repr(root) in str(info.value) or root in str(info.value)


def test_url_with_a_password_is_refused_without_echoing_it():
    with pytest.raises(ConfigError) as info:
        ObjectDataset("https://user:hunter2-password@example.com/data/", ["a.bin"])
    assert "hunter2-password" not in str(info.value)
    assert "credentials" in str(info.value)


@pytest.mark.parametrize(
    "root, scheme",
    [("wasb://c@a/prefix/", "wasb"), ("ftp://host/data/", "ftp"), ("hdfs://nn/data/", "hdfs")],
)
def test_unknown_scheme_is_a_config_error_naming_it(root, scheme):
    with pytest.raises(ConfigError) as info:
        ObjectDataset(root, ["a.bin"])
    message = str(info.value)
    assert repr(scheme) in message and root in message


def test_malformed_endpoint_url_is_a_config_error_naming_it(bad_objects, s3_env):
    # Refused when the dataset is made, before any worker starts.
    with pytest.raises(ConfigError) as info:
        ObjectDataset(
            S3Config.from_url(bad_objects.url, endpoint_url="ftp://127.0.0.1:1/"),
            ["large/large.bin"],
        )
    assert "ftp://127.0.0.1:1/" in str(info.value)


def test_empty_s3_prefix_is_a_config_error_naming_it(s3_env, reliability_bucket):
    root = f"s3://{reliability_bucket}/nothing-here/"
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        ObjectDataset(root)
    assert time.monotonic() - started < FAST
    assert info.value.url == root
    assert info.value.cause == "EmptyPrefix"
    assert root in str(info.value)


def test_image_folder_without_images_is_a_config_error_naming_it(bad_objects, s3_env):
    root = bad_objects.url + "notimages/"
    with pytest.raises(ConfigError) as info:
        ImageFolder(root)
    assert info.value.url == root
    assert root in str(info.value)


def test_empty_local_directory_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as info:
        ObjectDataset(tmp_path)
    assert str(tmp_path) in str(info.value)
    assert info.value.cause == "EmptyPrefix"


def test_missing_local_directory_is_a_config_error_naming_it(tmp_path):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(ConfigError) as info:
        ObjectDataset(missing, ["a.bin"])
    assert str(missing) in str(info.value)


# ---------------------------------------------------------------------------- the store


def test_missing_bucket_from_workers_keeps_type_and_url(s3_env):
    ds = ObjectDataset("s3://no-such-bucket-reliability/", ["a.bin"])
    error = _fails_fast(BucketNotFound, ds, 2)
    assert error.url == "s3://no-such-bucket-reliability/a.bin"
    assert "NoSuchBucket" in str(error)


def test_unknown_access_key_fails_fast_when_listing(bad_objects, s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "CLNOSUCHKEY000000000")
    started = time.monotonic()
    with pytest.raises(AccessDenied) as info:
        ObjectDataset(bad_objects.url)
    assert time.monotonic() - started < FAST
    assert info.value.url == bad_objects.url
    assert "InvalidAccessKeyId" in str(info.value)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_no_credentials_at_all_fails_fast_naming_the_object(
    bad_objects, s3_env, s3_server, monkeypatch, num_workers
):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    # Off EC2 the instance-metadata probe would only add its own timeouts.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    ds = ObjectDataset(
        S3Config.from_url(bad_objects.url, endpoint_url=s3_server.endpoint_url), ["large/large.bin"]
    )
    error = _fails_fast(AccessDenied, ds, num_workers)
    assert error.cause == "NoCredentials"
    assert error.url is not None and error.url.startswith(bad_objects.url)
    assert "anonymous=True" in str(error)
