"""Runs the Ray tests (``cluster/``) in a child pytest inside a loopback-only network
namespace (``unshare -rn``: a user and a network namespace whose only interface is ``lo``),
where the one Ray cluster they share listens on 127.0.0.1 and reaches nothing else."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executors.conftest import INSIDE

ROOT = Path(__file__).resolve().parents[2]
ENTER = "ip link set lo up && exec \"$0\" \"$@\""


def loopback_namespace() -> str | None:
    """Why a loopback-only namespace cannot be made here (None: it can)."""
    try:
        probe = subprocess.run(
            ["unshare", "-rn", "sh", "-c", "ip link set lo up"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare -rn could not run ({exc})"
    if probe.returncode != 0:
        return f"unshare -rn failed: {probe.stderr.strip() or probe.returncode}"
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_executor_on_a_loopback_only_cluster():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'concurrent-loader[ray]')")
    if (why := loopback_namespace()) is not None:
        pytest.skip(f"Ray may only start on loopback here, in a network namespace: {why}")
    env = dict(os.environ)
    env.update({INSIDE: "1", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)})
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "pytest", "tests/executors/cluster", "-q"]
    command += ["-p", "no:cacheprovider", "-x"]
    child = subprocess.run(
        ["unshare", "-rn", "sh", "-c", ENTER, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert child.returncode == 0, f"{child.stdout[-8000:]}\n{child.stderr[-4000:]}"
