"""ProxyProcess: argument checks before anything starts, and a child that never outlives
its stop() or its parent; and ``python -m concurrent_loader.testing.proxy``."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from concurrent_loader.testing import FaultPlan, LocalS3Server, ProxyProcess

from ._proxy_support import SMALL_KEYS, ProxyFactory, object_path, read_head, send_get


def test_proxy_process_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ProxyProcess("ftp://127.0.0.1:1")
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", latency_ms=-5)
    with pytest.raises(ValueError):
        ProxyProcess("http://127.0.0.1:1", bandwidth_bytes_per_s=0)
    with pytest.raises(TypeError):
        ProxyProcess("http://127.0.0.1:1", faults={"slowdown_503": 0.1})  # type: ignore[arg-type]


def test_stop_leaves_no_process(proxy_factory: ProxyFactory, s3_bucket: str, objects: dict) -> None:
    proxy = proxy_factory(faults=FaultPlan(stall=1.0, stall_seconds=60.0), cpus={0})
    assert os.sched_getaffinity(proxy.pid) == {0}
    assert proxy.cpu_seconds() > 0
    with send_get(proxy, object_path(s3_bucket, SMALL_KEYS[0])) as sock:
        assert read_head(sock)[0] == 200  # a stall is in progress
        pid = proxy.pid
        start = time.monotonic()
        proxy.stop()
        assert time.monotonic() - start < 3.0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert sock.recv(65536) == b""
    proxy.stop()  # idempotent
    with pytest.raises(RuntimeError, match="only once"):
        proxy.start()


def _process_ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_proxy_dies_with_its_parent() -> None:
    script = (
        "import os, sys\n"
        "from concurrent_loader.testing import ProxyProcess\n"
        "proxy = ProxyProcess('http://127.0.0.1:9').start()\n"
        "print(proxy.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, timeout=60, check=False
    )
    assert result.returncode == -9, result.stderr
    pid = int(result.stdout)
    deadline = time.monotonic() + 10
    while not _process_ended(pid):
        assert time.monotonic() < deadline, "the proxy outlived its parent"
        time.sleep(0.05)


def test_module_entry_point_serves(s3_server: LocalS3Server, s3_bucket: str, objects: dict) -> None:
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    command = [
        sys.executable,
        "-m",
        "concurrent_loader.testing.proxy",
        "--upstream",
        s3_server.endpoint_url,
        "--preset",
        "s3-like",
        "--straggler-fraction",
        "0",
        "--exit-on-stdin-eof",
    ]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            ready = json.loads(proc.stdout.readline())
            assert ready["ready"] is True and ready["pid"] == proc.pid
            conn = http.client.HTTPConnection("127.0.0.1", ready["port"], timeout=10)
            try:
                conn.request("GET", object_path(s3_bucket, SMALL_KEYS[0]))
                assert conn.getresponse().read() == objects[SMALL_KEYS[0]]
            finally:
                conn.close()
        finally:
            proc.stdin.close()  # the proxy stops when its stdin closes
            try:
                status = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
    assert status == 0
