"""A plain HTTP file server on localhost: the remote store where no S3 server can run.

:class:`FileServer` serves one directory as ``http://127.0.0.1:PORT/<relative path>``
(``GET`` and ``HEAD``, ``Range``, keep-alive; aiohttp's ``FileResponse``) from
``processes`` child processes that share one listening port (``SO_REUSEPORT``), so it can
serve thousands of requests a second on a many-core machine. It is what the GPU check uses
on a machine with nothing installed but Python packages: ``ObjectDataset`` /
``ImageFolder`` read it through the plain HTTP(S) store (``http://host/base/`` with keys).

Paths outside the directory are refused (404), and the server binds to 127.0.0.1 only.
``python -m concurrent_loader.testing.files ROOT --port P`` runs one process by hand.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Self

from .ports import free_port, release_ports
from .subprocesses import (
    ChildProcess,
    check_cpus,
    process_cpu_seconds,
    tail_of,
    terminate_process,
)

__all__ = ["FileServer"]


class FileServer(ChildProcess):
    """Serves ``root`` over HTTP on 127.0.0.1 from ``processes`` processes, pinned to
    ``cpus`` when given (so a benchmark can keep the server off the client's cores)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        processes: int = 1,
        cpus: Iterable[int] | None = None,
        startup_timeout_s: float = 15.0,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"not a directory: {self.root}")
        self.processes = processes
        self.cpus = check_cpus(cpus)
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self._children: list[subprocess.Popen[bytes]] = []
        self._log = tempfile.TemporaryFile(prefix="concurrent-loader-files-")  # noqa: SIM115

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if not self._children:
            raise RuntimeError("the file server was not started")
        return self._children[0].pid

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(child.pid) for child in self._children)

    def start(self) -> Self:
        self.port = free_port()
        command = [sys.executable, "-m", __name__, str(self.root), "--port", str(self.port)]
        try:
            for _ in range(self.processes):
                child = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
                self._children.append(child)
                if self.cpus is not None:
                    os.sched_setaffinity(child.pid, self.cpus)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            for child in self._children:
                if child.poll() is not None:
                    raise RuntimeError(
                        f"the file server exited with {child.returncode}: {tail_of(self._log)}"
                    )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the file server did not listen within {self.startup_timeout_s} s")

    def stop(self) -> None:
        for child in self._children:
            terminate_process(child, grace_s=5.0)
        self._children.clear()
        if self.port:
            release_ports([self.port])
            self.port = 0
        self._log.close()


def _serve(root: Path, port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        path = (root / request.match_info["path"]).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise web.HTTPNotFound()
        if request.http_range.start is not None or request.http_range.stop is not None:
            return web.FileResponse(path)
        # A whole file: read here, without FileResponse's executor round trips (measured:
        # 165 instead of 305 us of server CPU per 110 KB GET).
        return web.Response(body=path.read_bytes(), content_type="application/octet-stream")

    app = web.Application()
    app.router.add_route("GET", "/{path:.*}", handle)  # GET routes answer HEAD too
    web.run_app(app, host="127.0.0.1", port=port, reuse_port=True, print=None, access_log=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a directory over HTTP on 127.0.0.1.")
    parser.add_argument("root", type=Path)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    _serve(args.root.resolve(), args.port)


if __name__ == "__main__":
    main()
