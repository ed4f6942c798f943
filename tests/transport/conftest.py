"""Fixtures of the transport tests: an event loop of each kind, a self-signed certificate."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ._server import open_sockets

try:
    import uvloop

    HAVE_UVLOOP = True
except ImportError:  # pragma: no cover - uvloop is an optional extra
    HAVE_UVLOOP = False

LOOPS = [
    "asyncio",
    pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="no uvloop")),
]

Runner = Callable[[Callable[[], Awaitable[Any]]], Any]


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Runner:
    """Run an async test body on a fresh event loop of the parametrized kind, and check
    that it left no socket open."""

    def runner(main: Callable[[], Awaitable[Any]]) -> Any:
        loop = uvloop.new_event_loop() if request.param == "uvloop" else asyncio.new_event_loop()
        before = open_sockets()
        try:
            result = loop.run_until_complete(main())
            loop.run_until_complete(asyncio.sleep(0))
            assert open_sockets() <= before, "the test left sockets open"
            return result
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    return runner


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl CLI to make a self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key
