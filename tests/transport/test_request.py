"""The bytes of a GET, and every request refused before it reaches a socket."""

from __future__ import annotations

import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.transport import ConnectionPool, Origin
from concurrent_loader.transport.request import build_request, range_value

from .conftest import Runner


def test_request_bytes() -> None:
    request = build_request("/b/k%20x?a=1", "h:9000", [("x-amz-date", "20240101T000000Z")])
    assert request == (
        b"GET /b/k%20x?a=1 HTTP/1.1\r\nHost: h:9000\r\nx-amz-date: 20240101T000000Z\r\n\r\n"
    )


def test_range_header() -> None:
    request = build_request("/k", "h", [("x-a", "1")], (5, 10))
    assert request == b"GET /k HTTP/1.1\r\nHost: h\r\nx-a: 1\r\nRange: bytes=5-9\r\n\r\n"
    assert range_value((0, 1)) == "bytes=0-0"
    assert range_value((100, 1 << 40)) == f"bytes=100-{(1 << 40) - 1}"


@pytest.mark.parametrize("byte_range", [(-1, 5), (5, 5), (6, 5), (True, 5), (0.0, 5), (0, "5")])
def test_bad_ranges_are_refused(byte_range: tuple[int, int]) -> None:
    with pytest.raises(ConfigError) as info:
        build_request("/k", "h", [], byte_range)
    assert info.value.cause == "InvalidArgument"


@pytest.mark.parametrize("name", ["host", "Host", "HOST"])
def test_a_callers_host_header_is_refused(name: str) -> None:
    # The transport sends the origin's Host; a second one would be a different request.
    with pytest.raises(ConfigError, match="Host") as info:
        build_request("/k", "h", [("x-a", "1"), (name, "example.com")])
    assert info.value.cause == "InvalidArgument"


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/a b", []),
        ("no-slash", []),
        ("", []),
        ("/ok", [("x-evil", "1\r\nInjected: yes")]),
        ("/ok", [("x-evil", "1\nInjected: yes")]),
        ("/ok", [("x-evil\r\nInjected", "yes")]),
        ("/ok\r\nInjected: yes", []),
        ("/ünicode", []),
        ("/ok", [("x-a", "ünicode")]),
    ],
)
def test_requests_that_could_break_framing_are_refused(
    target: str, headers: list[tuple[str, str]]
) -> None:
    with pytest.raises(ConfigError) as info:
        build_request(target, "h", headers)
    assert info.value.cause == "InvalidArgument"


def test_bad_requests_are_rejected(run: Runner) -> None:
    async def main() -> None:
        async with ConnectionPool() as pool:
            origin = Origin("http", "127.0.0.1", 1)
            for target, headers in [
                ("/a b", []),
                ("no-slash", []),
                ("/ok", [("x-evil", "1\r\nInjected: yes")]),
                ("/ok\r\nInjected: yes", []),
                ("/ünicode", []),
                ("/ok", [("Host", "example.com")]),
            ]:
                with pytest.raises(ConfigError):
                    await pool.get(origin, target, headers, url="x")
            with pytest.raises(ConfigError):
                await pool.get(origin, "/ok", [], url="x", byte_range=(5, 5))
            # Refused before connecting: port 1 has no server, yet nothing was tried.
            assert repr(pool) == "<ConnectionPool 0/256 open, 0 idle>"

    run(main)
