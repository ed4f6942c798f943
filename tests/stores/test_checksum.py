"""The checksums a store's response offers, which one is checked, and how a mismatch reads.

The digests are compared with independent implementations (zlib, hashlib) and with the
published check values of CRC-32C and CRC-64/NVME (the CRC of ``b"123456789"``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib

import pytest

from concurrent_loader.errors import IntegrityError, Reason
from concurrent_loader.stores.checksum import (
    ALGORITHMS,
    Checksum,
    covers_whole_object,
    http_checksum,
    s3_checksum,
)

DATA = os.urandom(110_000)


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


@pytest.mark.parametrize("body", [DATA, bytearray(DATA), memoryview(DATA), b"x"])
def test_digests_match_independent_implementations(body: bytes) -> None:
    assert ALGORITHMS["crc32"](body) == zlib.crc32(body).to_bytes(4, "big")
    for name in ("sha1", "sha256", "md5"):
        assert ALGORITHMS[name](body) == hashlib.new(name, body).digest()


def test_crc_check_values() -> None:
    assert ALGORITHMS["crc32c"](b"123456789").hex() == "e3069283"
    assert ALGORITHMS["crc64nvme"](b"123456789").hex() == "ae8b14860a799888"


def test_s3_prefers_the_cheapest_full_object_checksum() -> None:
    headers = {
        "x-amz-checksum-sha256": b64(hashlib.sha256(DATA).digest()),
        "x-amz-checksum-crc32": b64(zlib.crc32(DATA).to_bytes(4, "big")),
        "etag": f'"{hashlib.md5(DATA).hexdigest()}"',
    }
    checksum = s3_checksum(headers, etag_md5=True)
    assert checksum is not None
    assert (checksum.algorithm, checksum.source) == ("crc32", "x-amz-checksum-crc32")
    checksum.check(DATA, "s3://b/k")
    only_sha = {"x-amz-checksum-sha256": headers["x-amz-checksum-sha256"]}
    assert s3_checksum(only_sha, etag_md5=False) == Checksum(
        "sha256", hashlib.sha256(DATA).digest(), "x-amz-checksum-sha256"
    )


def test_s3_skips_composite_and_malformed_checksums() -> None:
    crc = b64(zlib.crc32(DATA).to_bytes(4, "big"))
    assert s3_checksum({"x-amz-checksum-crc32": crc + "-2"}, etag_md5=False) is None
    assert (
        s3_checksum(
            {"x-amz-checksum-crc32": crc, "x-amz-checksum-type": "COMPOSITE"}, etag_md5=False
        )
        is None
    )
    assert s3_checksum({"x-amz-checksum-crc32": "not base64!"}, etag_md5=False) is None
    assert s3_checksum({"x-amz-checksum-sha256": crc}, etag_md5=False) is None  # wrong size
    full = {"x-amz-checksum-crc32": crc, "x-amz-checksum-type": "FULL_OBJECT"}
    assert s3_checksum(full, etag_md5=False) is not None


def test_s3_etag_is_an_md5_only_when_asked_and_single_part() -> None:
    md5 = hashlib.md5(DATA).hexdigest()
    assert s3_checksum({"etag": f'"{md5}"'}, etag_md5=False) is None
    checksum = s3_checksum({"etag": f'"{md5}"'}, etag_md5=True)
    assert checksum == Checksum("md5", bytes.fromhex(md5), "etag")
    assert s3_checksum({"etag": f'"{md5[:32]}-2"'}, etag_md5=True) is None
    assert s3_checksum({"etag": '"not-hex-not-hex-not-hex-not-hex"'}, etag_md5=True) is None


def test_http_x_goog_hash_and_content_md5() -> None:
    crc32c = b64(ALGORITHMS["crc32c"](DATA))
    md5 = b64(hashlib.md5(DATA).digest())
    goog = {"x-goog-hash": f"md5={md5}, crc32c={crc32c}"}
    checksum = http_checksum(goog, whole=True)
    assert checksum is not None and checksum.algorithm == "crc32c"
    checksum.check(DATA, "https://h/k")
    assert http_checksum({"x-goog-hash": f"md5={md5}"}, whole=False) is not None
    # Content-MD5 of a 206 may be the range's or the object's: only a 200's is taken.
    assert http_checksum({"content-md5": md5}, whole=True) == Checksum(
        "md5", hashlib.md5(DATA).digest(), "content-md5"
    )
    assert http_checksum({"content-md5": md5}, whole=False) is None
    assert http_checksum({}, whole=True) is None


def test_a_mismatch_names_the_object_algorithm_expected_and_got() -> None:
    expected = zlib.crc32(DATA).to_bytes(4, "big")
    corrupted = bytearray(DATA)
    corrupted[5] ^= 0xFF
    with pytest.raises(IntegrityError) as caught:
        Checksum("crc32", expected, "x-amz-checksum-crc32").check(corrupted, "s3://bkt/a/b.jpg")
    error = caught.value
    assert error.cause == Reason.CHECKSUM_MISMATCH
    assert error.retryable
    assert error.url == "s3://bkt/a/b.jpg"
    text = str(error)
    assert "s3://bkt/a/b.jpg" in text and "crc32" in text
    assert b64(expected) in text and b64(zlib.crc32(corrupted).to_bytes(4, "big")) in text
    md5 = hashlib.md5(DATA).digest()
    with pytest.raises(IntegrityError, match=md5.hex()):
        Checksum("md5", md5, "etag").check(corrupted, "s3://bkt/k")


def test_a_range_is_the_whole_object_only_from_zero_to_its_end() -> None:
    assert covers_whole_object({"content-range": "bytes 0-99/100"})
    assert not covers_whole_object({"content-range": "bytes 0-98/100"})
    assert not covers_whole_object({"content-range": "bytes 1-99/100"})
    assert not covers_whole_object({"content-range": "bytes 0-99/*"})
    assert not covers_whole_object({})


def test_http_a_body_gcs_decompressed_on_its_way_is_not_checked_against_its_stored_hashes() -> None:
    # An object stored gzip-encoded is sent decompressed to a client that does not accept
    # gzip (GCS's decompressive transcoding); its x-goog-hash is still the stored bytes'.
    stored = zlib.compress(DATA)
    goog = f"crc32c={b64(ALGORITHMS['crc32c'](stored))},md5={b64(hashlib.md5(stored).digest())}"
    transcoded = {"x-goog-hash": goog, "x-goog-stored-content-encoding": "gzip"}
    assert http_checksum(transcoded, whole=True) is None
    as_stored = {**transcoded, "content-encoding": "gzip"}  # sent as stored: its bytes
    checksum = http_checksum(as_stored, whole=True)
    assert checksum is not None
    checksum.check(stored, "https://h/k")
    identity = {"x-goog-hash": goog, "x-goog-stored-content-encoding": "identity"}
    assert http_checksum(identity, whole=True) is not None
