"""Running a benchmark's smoke run as a child process, as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(module: str, args: Sequence[str], timeout_s: float) -> tuple[int, str]:
    """``python -m module args`` from the repository root: (exit status, stdout + stderr).

    It runs in a session of its own, so a run past ``timeout_s`` is ended with everything it
    started (the S3 server, the proxies) and the test fails with the output's tail."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"smoke run exceeded {timeout_s} s; output tail:\n{output[-4000:]}")
    return proc.returncode, output
