"""What the GCS tests share: the emulator's environment, a bucket of images, a fault proxy in
front of fake-gcs-server, and :class:`Recorder`, a loopback GCS that records the headers it
gets and answers as scripted (fake-gcs-server ignores authentication and never throttles)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import anycrc
import pytest

from concurrent_loader.testing import ProxyProcess
from concurrent_loader.testing.gcs_server import FakeGcsServer

BUCKET = "gcs-tests"
IMAGES = "images/train/"

_LEAKY_ENV = (
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


@pytest.fixture
def gcs_env(gcs_server: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``STORAGE_EMULATOR_HOST`` pointing at ``gcs_server`` for this test (as Google's
    libraries take it), the developer's Google and proxy settings cleared."""
    for name in _LEAKY_ENV:
        monkeypatch.delenv(name, raising=False)
    env = gcs_server.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture(scope="session")
def gcs_bucket(gcs_server: FakeGcsServer) -> str:
    gcs_server.create_bucket(BUCKET)
    return BUCKET


@pytest.fixture(scope="session")
def gcs_images(
    gcs_server: FakeGcsServer,
    gcs_bucket: str,
    image_folder: tuple[Path, list[tuple[str, str, str]]],
) -> tuple[str, list[tuple[str, str, str]]]:
    """``gs://gcs-tests/images/train/`` holding the session's image folder, and its files
    (key, class, sha256)."""
    root, files = image_folder
    gcs_server.upload_dir(root, gcs_bucket, IMAGES)
    return f"gs://{gcs_bucket}/{IMAGES}", files


@pytest.fixture
def gcs_proxy(gcs_server: FakeGcsServer) -> Iterator[Callable[..., ProxyProcess]]:
    """``make(**ProxyProcess kwargs)`` -> a started proxy in front of ``gcs_server``."""
    started: list[ProxyProcess] = []

    def make(**kwargs: Any) -> ProxyProcess:
        proxy = ProxyProcess(gcs_server.endpoint_url, **kwargs)
        started.append(proxy)
        return proxy.start()

    yield make
    for proxy in reversed(started):
        proxy.stop()


def goog_hash(data: bytes) -> str:
    crc = int(anycrc.Model("CRC32C").calc(data)).to_bytes(4, "big")
    return "crc32c=" + base64.b64encode(crc).decode()


@dataclass
class Recorder:
    """A loopback GCS: serves ``objects`` (name -> bytes) with their ``x-goog-hash``, and
    lists them all on one page; answers the next requests from ``script`` (status, headers, body)
    first; records each request's (path, Authorization header)."""

    objects: dict[str, bytes]
    script: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    #: when each request of ``seen`` arrived (``time.time()``)
    arrived: list[float] = field(default_factory=list)
    endpoint_url: str = ""

    def answer(self, path: str, auth: str | None) -> tuple[int, dict[str, str], bytes]:
        self.seen.append((path, auth))
        self.arrived.append(time.time())
        if self.script:
            return self.script.pop(0)
        if urlsplit(path).path.endswith("/o"):  # a listing: one page of everything
            items = [{"name": n, "size": str(len(d))} for n, d in sorted(self.objects.items())]
            return 200, {"content-type": "application/json"}, json.dumps({"items": items}).encode()
        name = unquote(urlsplit(path).path.rsplit("/o/", 1)[-1])
        if name not in self.objects:
            error = {
                "error": {
                    "code": 404,
                    "message": f"No such object: {name}",
                    "errors": [{"reason": "notFound"}],
                }
            }
            return 404, {"content-type": "application/json"}, json.dumps(error).encode()
        data = self.objects[name]
        return 200, {"x-goog-hash": goog_hash(data)}, data


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    state = Recorder({})

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status, headers, body = state.answer(self.path, self.headers.get("Authorization"))
            self.send_response(status)
            for name, value in {**headers, "content-length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.endpoint_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
