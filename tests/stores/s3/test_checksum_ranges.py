"""What the S3 store makes of the checksum headers of a ranged GET, against a server that
answers as S3 does for an object uploaded in parts with checksums: the whole object's
checksum is composite (``<checksum of the parts' checksums>-N``), a range that is exactly
one part carries that part's checksum, and any other range none. A part's checksum is the
range's (botocore checks it against the range's body), never the whole object's: a read in
parts aligned with the upload's parts checks each part, not the assembled object, against
it."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import random
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import serve_http

from concurrent_loader import FetchConfig, RetryConfig
from concurrent_loader.errors import IntegrityError, Reason
from concurrent_loader.fetch.client import FetchClient
from concurrent_loader.fetch.parts import PartsConfig, read_in_parts
from concurrent_loader.stores.base import ByteRange
from concurrent_loader.stores.s3 import S3Config

UPLOAD_PART = 64 * 1024
BODY = random.Random(7).randbytes(3 * UPLOAD_PART)
PARTS = [BODY[i : i + UPLOAD_PART] for i in range(0, len(BODY), UPLOAD_PART)]


def _crc32(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


COMPOSITE = _b64(_crc32(b"".join(_crc32(part) for part in PARTS))) + f"-{len(PARTS)}"
ETAG = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in PARTS)).hexdigest()


class _MultipartObject(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path not in ("/bkt/big.bin", "/bkt/flipped.bin"):
            self.send_error(404)
            return
        headers = {"ETag": f'"{ETAG}-{len(PARTS)}"'}
        ranged = self.headers.get("Range")
        if ranged is None:
            body, status = BODY, 200
            headers["x-amz-checksum-crc32"] = COMPOSITE
        else:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start, end = int(first), min(int(last) + 1, len(BODY))
            if start >= len(BODY):
                self.send_error(416)
                return
            body, status = BODY[start:end], 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(BODY)}"
            if start % UPLOAD_PART == 0 and end - start == UPLOAD_PART:
                headers["x-amz-checksum-crc32"] = _b64(_crc32(body))  # the part's
        if self.path == "/bkt/flipped.bin":  # a byte inverted on its way
            body = body[:100] + bytes((body[100] ^ 0xFF,)) + body[101:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with serve_http(_MultipartObject) as url:
        yield url


def _config(endpoint: str) -> S3Config:
    return S3Config.from_url(
        "s3://bkt/",
        endpoint_url=endpoint,
        region="us-east-1",
        anonymous=True,
        addressing_style="path",
    ).resolved()


def test_a_read_in_parts_aligned_with_the_uploads_parts_is_not_checked_against_a_part(
    endpoint: str,
) -> None:
    fetch = FetchConfig(retry=RetryConfig(max_attempts=2, base_delay=0.01, max_delay=0.02))
    config = _config(endpoint)

    async def read() -> tuple[bytearray, Any]:
        client = FetchClient(config.open(fetch), fetch)
        try:
            part = await client.get_body("big.bin", ByteRange(UPLOAD_PART, 2 * UPLOAD_PART))
            parts = PartsConfig(part_size=UPLOAD_PART, parts_in_flight=2)
            return await read_in_parts(client, "big.bin", None, len(BODY), parts), part
        finally:
            await client.close()

    whole, part = asyncio.run(read())
    assert part.data == PARTS[1] and part.object_checksum is None
    assert bytes(whole) == BODY


def test_a_range_that_is_one_part_is_checked_against_the_parts_checksum(endpoint: str) -> None:
    fetch = FetchConfig()
    config = _config(endpoint)

    async def get(byte_range: ByteRange) -> Any:
        store = config.open(fetch)
        try:
            return await store.get("flipped.bin", byte_range)
        finally:
            await store.close()

    with pytest.raises(IntegrityError) as caught:
        asyncio.run(get(ByteRange(UPLOAD_PART, 2 * UPLOAD_PART)))
    assert caught.value.cause == Reason.CHECKSUM_MISMATCH
    assert caught.value.url == "s3://bkt/flipped.bin"
    # A range that is no part comes without a checksum: only its length can be checked.
    other = asyncio.run(get(ByteRange(10, 1000)))
    assert len(other.data) == 990 and other.object_checksum is None
