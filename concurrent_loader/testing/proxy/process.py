"""The proxy as a child process, started and stopped by the test or benchmark that needs it.

:class:`ProxyProcess` validates its arguments before starting anything, returns from
``start()`` once the proxy listens, and never leaves the process behind: ``stop()``
terminates and reaps it, and the child also exits when its parent dies (its stdin
closes). The child runs this checkout's proxy modules without importing the rest of
``concurrent_loader``, so it starts fast and its CPU time is its own.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import IO, Any

from ..subprocesses import ChildProcess, check_cpus, tail_of, terminate_process
from .bandwidth import check_rate
from .faults import FaultPlan
from .latency import LatencyModel
from .server import RESET_PATH, STATS_PATH, parse_upstream

__all__ = ["ProxyProcess"]

logger = logging.getLogger("concurrent_loader.testing.proxy")

# The child imports this package as a top-level ``proxy`` from the folder above it, in
# isolated mode (-I): neither ``concurrent_loader/__init__`` (which pulls in torch) nor
# the caller's PYTHONPATH is loaded, and it runs exactly the code next to this file.
_CHILD_MAIN = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from proxy.cli import main; sys.exit(main())"
)
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ProxyProcess(ChildProcess):
    """The proxy as a child process, for tests and benchmarks.

    Options as for :class:`~.server.ProxyServer`: fixed (``latency_ms``, ``jitter_ms``) or
    lognormal (``latency_p50_ms``, ``latency_p99_ms``) first-byte latency, stragglers
    (``straggler_fraction`` of object GETs ``straggler_s`` late), a ``preset`` such as
    ``"s3-like"`` whose values explicit options override, bandwidth caps per connection
    (``bandwidth_bytes_per_s``) and in total (``total_bandwidth``), and ``faults``, whose
    seed also seeds the latency draws. The resolved model is :attr:`latency`.

    Lifecycle: ``start()`` (or ``with``) once, then ``stop()`` (idempotent); it cannot be
    restarted. ``start()`` returns when the proxy listens.
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency_ms: float = 0.0,
        jitter_ms: float = 0.0,
        latency_p50_ms: float | None = None,
        latency_p99_ms: float | None = None,
        straggler_fraction: float | None = None,
        straggler_s: float | None = None,
        preset: str | None = None,
        bandwidth_bytes_per_s: float | None = None,
        total_bandwidth: float | None = None,
        faults: FaultPlan | None = None,
        cpus: Iterable[int] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout_s: float = 15.0,
        log_level: str = "WARNING",
    ) -> None:
        parse_upstream(upstream)
        self.latency = LatencyModel.from_options(
            preset,
            latency_ms=latency_ms,
            jitter_ms=jitter_ms,
            latency_p50_ms=latency_p50_ms,
            latency_p99_ms=latency_p99_ms,
            straggler_fraction=straggler_fraction,
            straggler_s=straggler_s,
        )
        check_rate("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        check_rate("total_bandwidth", total_bandwidth)
        if faults is not None and not isinstance(faults, FaultPlan):
            raise TypeError(f"faults must be a FaultPlan, got {type(faults).__name__}")
        self.upstream = upstream
        self.latency_ms = latency_ms
        self.jitter_ms = jitter_ms
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.total_bandwidth = total_bandwidth
        self.faults = faults or FaultPlan()
        self.cpus = check_cpus(cpus)
        self.host = host
        self._requested_port = port
        self._startup_timeout_s = startup_timeout_s
        self._log_level = log_level
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None
        self._stopped = False

    def command(self) -> list[str]:
        """The command line that runs this proxy (with the preset resolved into flags)."""
        cmd = [
            sys.executable,
            "-I",
            "-c",
            _CHILD_MAIN,
            _PACKAGE_PARENT,
            # Our end of its stdin closes when we exit, even when killed, so the proxy
            # never outlives its parent.
            "--exit-on-stdin-eof",
            "--upstream",
            self.upstream,
            "--host",
            self.host,
            "--port",
            str(self._requested_port),
            "--log-level",
            self._log_level,
        ]
        for name, rate in (
            ("--bandwidth-bytes-per-s", self.bandwidth_bytes_per_s),
            ("--total-bandwidth", self.total_bandwidth),
        ):
            if rate is not None:
                cmd += [name, repr(float(rate))]
        if self.cpus is not None:
            cmd += ["--cpus", ",".join(str(c) for c in sorted(self.cpus))]
        return cmd + self.latency.to_cli_args() + self.faults.to_cli_args()

    def start(self) -> ProxyProcess:
        if self._proc is not None or self._stopped:
            raise RuntimeError("a ProxyProcess can be started only once")
        # Lives as long as the process (closed in stop()), so no context manager.
        self._log = tempfile.TemporaryFile(prefix="concurrent-loader-proxy-")  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log
        )
        try:
            self._port = self._read_ready_line()
        except BaseException:
            self.stop()
            raise
        logger.debug("proxy pid %d listening at %s", self._proc.pid, self.endpoint_url)
        return self

    def _read_ready_line(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None and self._log
        deadline = time.monotonic() + self._startup_timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            buffer = b""
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise RuntimeError(
                        f"proxy did not start within {self._startup_timeout_s}s; "
                        f"log:\n{tail_of(self._log)}"
                    )
                data = os.read(self._proc.stdout.fileno(), 4096)
                if not data:
                    self._proc.wait()
                    raise RuntimeError(
                        f"proxy exited with status {self._proc.returncode} before it was "
                        f"ready; log:\n{tail_of(self._log)}"
                    )
                buffer += data
        return int(json.loads(buffer.split(b"\n", 1)[0])["port"])

    def stop(self) -> None:
        """Stop the process (SIGTERM, SIGKILL after 5 s). Idempotent."""
        self._stopped = True
        if self._proc is not None:
            terminate_process(self._proc, grace_s=5.0)
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("proxy not started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("proxy not started")
        return self._proc.pid

    def log_tail(self) -> str:
        """The end of the proxy's stderr log."""
        return tail_of(self._log) if self._log is not None else ""

    def _control(self, method: str, path: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"{method} {path} -> {response.status}: {body[:200]!r}")
            result: dict[str, Any] = json.loads(body)
            return result
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        """The proxy's counters, as served at ``/__proxy__/stats``.

        Keys: ``requests``, ``requests_by_method``, ``responses_by_status`` (str keys),
        ``faults`` (every name in ``FAULT_NAMES``), ``stragglers`` (requests the latency
        model delayed by ``straggler_s``), ``bytes_sent`` (heads and bodies to clients),
        ``inflight`` / ``max_inflight`` (from request arrival to last byte),
        ``client_connections`` / ``client_connections_total``,
        ``upstream_connections_total`` and ``upstream_errors``. Control requests are not
        counted, except as connections.
        """
        return self._control("GET", STATS_PATH)

    def reset_stats(self) -> None:
        """Zero the counters and forget request history (faults restart from n = 0)."""
        self._control("POST", RESET_PATH)
