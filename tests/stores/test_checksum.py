"""The checksums a store's response offers, which one is checked, and how a mismatch reads.

The digests are compared with independent implementations (zlib, hashlib) and with the
published check values of CRC-32C and CRC-64/NVME (the CRC of ``b"123456789"``). Every
algorithm is also checked as the stores check it, piece by piece as the body arrives
(:class:`RunningChecksum`), through the S3 and HTTP stores against a local server.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import os
import random
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import serve_http

from concurrent_loader import FetchConfig
from concurrent_loader.errors import IntegrityError, Reason
from concurrent_loader.stores import HttpConfig
from concurrent_loader.stores.base import ByteRange
from concurrent_loader.stores.checksum import (
    ALGORITHMS,
    Checksum,
    RunningChecksum,
    covers_whole_object,
    http_checksum,
    s3_checksum,
)
from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.transport import Response

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


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_a_running_checksum_fed_in_pieces_is_the_whole_bodys(algorithm: str) -> None:
    digest = ALGORITHMS[algorithm]
    rng = random.Random(algorithm)
    checksum = Checksum(algorithm, digest(DATA), "x-amz-checksum-" + algorithm)
    for _ in range(5):
        running = checksum.running()
        assert isinstance(running, RunningChecksum)
        view, pos = memoryview(DATA), 0
        while pos < len(DATA):
            step = rng.choice((1, 7, 1000, 16_384, 65_536))
            running.update(view[pos : pos + step])
            pos += step
        assert running.digest() == digest(DATA) and running.length == len(DATA)
        running.check("s3://bkt/k")
    corrupted = bytearray(DATA)
    corrupted[len(DATA) // 2] ^= 0x01
    running = checksum.running()
    running.update(memoryview(corrupted)[:500])
    running.update(memoryview(corrupted)[500:])
    with pytest.raises(IntegrityError) as caught:
        running.check("s3://bkt/k")
    with pytest.raises(IntegrityError) as whole:
        checksum.check(corrupted, "s3://bkt/k")
    # The same message as the whole-body check: length, algorithm, both digests, the object.
    assert str(caught.value) == str(whole.value)
    assert caught.value.url == "s3://bkt/k" and caught.value.cause == Reason.CHECKSUM_MISMATCH
    empty = Checksum(algorithm, digest(b""), "x").running()
    empty.check("s3://bkt/empty")


# -- the stores check each body as it arrives -----------------------------------------

#: a key's body: ``<algorithm>-<framing>[-flipped].bin``
STORED = random.Random(11).randbytes(300_000)


def _headers_for(algorithm: str, body: bytes, s3: bool) -> dict[str, str]:
    digest = ALGORITHMS[algorithm](body)
    if not s3:
        if algorithm == "md5":
            return {"Content-MD5": b64(digest)}
        return {"x-goog-hash": f"{algorithm}={b64(digest)}"}
    if algorithm == "md5":
        return {"ETag": f'"{digest.hex()}"'}
    return {"x-amz-checksum-" + algorithm: b64(digest)}


class _Checksummed(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        store, _, name = self.path.strip("/").partition("/")
        algorithm, framing, *flipped = name.removesuffix(".bin").split("-")
        body, status = STORED, 200
        headers = _headers_for(algorithm, body, store == "s3")
        ranged = self.headers.get("Range")
        if ranged is not None:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start, end = int(first), int(last) + 1
            body, status = body[start:end], 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(STORED)}"
            if store == "s3" and algorithm != "md5":  # as S3 does for a range that is a part
                headers.update(_headers_for(algorithm, body, True))
        if flipped:  # one byte inverted on its way
            body = body[:-100] + bytes((body[-100] ^ 0xFF,)) + body[-99:]
        self.send_response(status)
        for header, value in headers.items():
            self.send_header(header, value)
        if framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 40_000):
                piece = body[i : i + 40_000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def checksummed() -> Iterator[str]:
    with serve_http(_Checksummed) as url:
        yield url


def _store_config(endpoint: str, s3: bool) -> Any:
    if s3:
        return S3Config.from_url(
            "s3://s3/",
            endpoint_url=endpoint,
            region="us-east-1",
            anonymous=True,
            addressing_style="path",
            verify_etag_md5=True,
        ).resolved()
    return HttpConfig.from_url(endpoint + "/http/")


def _get(config: Any, key: str, byte_range: ByteRange | None = None) -> tuple[Any, list[Response]]:
    """The store's body for ``key`` and the transport's responses it read."""

    async def main() -> tuple[Any, list[Response]]:
        store = config.open(FetchConfig())
        responses: list[Response] = []
        transport_get = store._transport.get

        async def spied(*args: Any, **kwargs: Any) -> Response:
            response = await transport_get(*args, **kwargs)
            responses.append(response)
            return response

        store._transport.get = spied
        try:
            return await store.get(key, byte_range), responses
        finally:
            await store.close()

    return asyncio.run(main())


S3_ALGORITHMS = list(ALGORITHMS)
HTTP_ALGORITHMS = ["crc32c", "md5"]


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize(
    ("s3", "algorithm"),
    [(True, a) for a in S3_ALGORITHMS] + [(False, a) for a in HTTP_ALGORITHMS],
)
def test_stores_check_each_algorithm_as_the_body_arrives(
    checksummed: str, s3: bool, algorithm: str, framing: str
) -> None:
    config = _store_config(checksummed, s3)
    key = f"{algorithm}-{framing}.bin"
    body, [response] = _get(config, key)
    assert bytes(body.data) == STORED
    # Checked on the way in: the transport fed the store's running checksum the whole body.
    assert isinstance(response.digest, RunningChecksum)
    assert response.digest.checksum.algorithm == algorithm
    assert response.digest.length == len(STORED)
    with pytest.raises(IntegrityError) as caught:
        _get(config, f"{algorithm}-{framing}-flipped.bin")
    assert caught.value.cause == Reason.CHECKSUM_MISMATCH
    assert caught.value.url == config.url_for(f"{algorithm}-{framing}-flipped.bin")
    assert algorithm in str(caught.value)


@pytest.mark.parametrize("s3", [True, False])
def test_a_range_is_checked_as_it_arrives_against_its_own_checksum_only(
    checksummed: str, s3: bool
) -> None:
    config = _store_config(checksummed, s3)
    part = ByteRange(1000, 201_000)
    # S3 sends a range's own checksum (a part's) and the ETag: the first is checked on the
    # way in, the second kept for the assembled object.
    body, [response] = _get(config, "crc32c-length.bin", part)
    assert bytes(body.data) == STORED[1000:201_000]
    if s3:
        assert isinstance(response.digest, RunningChecksum)
        with pytest.raises(IntegrityError, match="crc32c"):
            _get(config, "crc32c-chunked-flipped.bin", part)
        body, _ = _get(config, "md5-length.bin", part)
        assert body.object_checksum is not None and body.object_checksum.source == "etag"
    else:
        # x-goog-hash is the whole object's: nothing to check a range against on its way.
        assert response.digest is None
        assert body.object_checksum is not None
        assert body.object_checksum.algorithm == "crc32c"
    whole = ByteRange(0, len(STORED))  # a range that is the whole object is checked as one
    body, [response] = _get(config, "crc32c-chunked.bin", whole)
    assert bytes(body.data) == STORED and isinstance(response.digest, RunningChecksum)
    with pytest.raises(IntegrityError):
        _get(config, "crc32c-length-flipped.bin", whole)
