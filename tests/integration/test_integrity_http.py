"""The plain HTTP(S) store checks GCS's ``x-goog-hash`` and ``Content-MD5``: a real HTTP
server on 127.0.0.1 sends them, the fault proxy in front of it inverts a byte of the body,
and the store fetches it again or ends in ``IntegrityError``; a range (answered ``206``, or
``200`` with its ``Content-Range``) is not checked against the whole object's checksum, and
an object without one still loads."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import serve_http

from concurrent_loader import FetchConfig, ObjectDataset, RetryConfig
from concurrent_loader.errors import IntegrityError, Reason
from concurrent_loader.stores.base import ByteRange
from concurrent_loader.stores.checksum import ALGORITHMS
from concurrent_loader.stores.http import HttpConfig
from concurrent_loader.testing import FaultPlan

from .conftest import closed_after_test

_rng = random.Random(1127)
BODY = _rng.randbytes(110_000)
CRC32C = base64.b64encode(ALGORITHMS["crc32c"](BODY)).decode()
MD5 = base64.b64encode(hashlib.md5(BODY).digest()).decode()
#: path -> the checksum headers its responses carry (the body is BODY for each)
OBJECTS = {
    "/data/goog.bin": {"x-goog-hash": f"crc32c={CRC32C},md5={MD5}"},
    "/data/md5.bin": {"Content-MD5": MD5},
    "/data/plain.bin": {},
}
RETRY = FetchConfig(retry=RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.05))


class _Objects(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        # Under /data-200/, a range is answered as rclone answers it: 200, its Content-Range
        # and exactly its bytes, with the whole object's headers (Content-MD5 too).
        answer_200 = self.path.startswith("/data-200/")
        headers = OBJECTS.get(self.path.replace("/data-200/", "/data/", 1))
        if headers is None:
            self.send_error(404)
            return
        body, status = BODY, 200
        ranged = self.headers.get("Range")
        if ranged:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            body, status = BODY[int(first) : int(last) + 1], 200 if answer_200 else 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if ranged:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(BODY)}")
        for name, value in headers.items():
            if status == 200 or name != "Content-MD5":  # a range's MD5 would be its own
                self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with serve_http(_Objects) as url:
        yield url


def _dataset(proxy: Any, name: str) -> ObjectDataset:
    dataset = ObjectDataset(f"{proxy.endpoint_url}/data/", [name], fetch_config=RETRY)
    return closed_after_test(dataset)


@pytest.mark.parametrize(("name", "algorithm"), [("goog.bin", "crc32c"), ("md5.bin", "md5")])
def test_a_corrupted_body_ends_in_integrity_error(
    origin: str, proxy_factory: Callable[..., Any], name: str, algorithm: str
) -> None:
    proxy = proxy_factory(origin, faults=FaultPlan(corrupt=1.0))
    with pytest.raises(IntegrityError) as caught:
        _dataset(proxy, name)[0]
    error = caught.value
    assert error.cause == Reason.CHECKSUM_MISMATCH
    assert error.url == f"{proxy.endpoint_url}/data/{name}"
    assert algorithm in str(error) and (CRC32C if algorithm == "crc32c" else MD5) in str(error)
    assert proxy.stats()["faults"]["corrupt"] == RETRY.retry.max_attempts


@pytest.mark.parametrize("name", ["goog.bin", "md5.bin", "plain.bin"])
def test_every_object_loads_and_a_corrupted_one_is_fetched_again(
    origin: str, proxy_factory: Callable[..., Any], name: str
) -> None:
    target = f"/data/{name}"
    seed = next(
        s
        for s in range(10_000)
        if FaultPlan(seed=s, corrupt=0.5).fault_for("GET", target, 0) == "corrupt"
        and FaultPlan(seed=s, corrupt=0.5).fault_for("GET", target, 1) is None
    )
    clean = proxy_factory(origin)
    assert _dataset(clean, name)[0] == BODY
    if name == "plain.bin":
        return  # nothing to check it against
    proxy = proxy_factory(origin, faults=FaultPlan(seed=seed, corrupt=0.5))
    assert _dataset(proxy, name)[0] == BODY
    assert proxy.stats()["faults"]["corrupt"] == 1


def test_a_range_keeps_the_whole_objects_checksum_for_its_reader(
    origin: str, proxy_factory: Callable[..., Any]
) -> None:
    proxy = proxy_factory(origin)

    async def get(byte_range: ByteRange) -> Any:
        store = HttpConfig.from_url(f"{proxy.endpoint_url}/data/").open(FetchConfig())
        try:
            return await store.get("goog.bin", byte_range)
        finally:
            await store.close()

    part = asyncio.run(get(ByteRange(1000, 2000)))
    assert bytes(part.data) == BODY[1000:2000]
    assert part.object_checksum is not None and part.object_checksum.algorithm == "crc32c"
    part.object_checksum.check(BODY, "whole")  # the object's, not the range's
    whole = asyncio.run(get(ByteRange(0, len(BODY))))  # a range that is the whole: checked
    assert bytes(whole.data) == BODY and whole.object_checksum is None


@pytest.mark.parametrize("name", ["goog.bin", "md5.bin"])
def test_a_200_for_a_range_is_not_checked_against_the_whole_objects_checksum(
    origin: str, proxy_factory: Callable[..., Any], name: str
) -> None:
    proxy = proxy_factory(origin)

    async def get(byte_range: ByteRange) -> Any:
        store = HttpConfig.from_url(f"{proxy.endpoint_url}/data-200/").open(FetchConfig())
        try:
            return await store.get(name, byte_range)
        finally:
            await store.close()

    part = asyncio.run(get(ByteRange(1000, 2000)))
    assert bytes(part.data) == BODY[1000:2000]
    if name == "goog.bin":  # GCS's hash is the object's: kept for the assembled read
        assert part.object_checksum is not None
        part.object_checksum.check(BODY, "whole")
    else:  # a Content-MD5 is not taken for a part
        assert part.object_checksum is None
    whole = asyncio.run(get(ByteRange(0, len(BODY))))  # the whole object: checked as it is
    assert bytes(whole.data) == BODY and whole.object_checksum is None
