"""Runs the Ray tests (``cluster/``) in a child pytest inside a loopback-only network
namespace (:mod:`tests.executors.namespace`), where the one Ray cluster they share listens
on 127.0.0.1 and reaches nothing else."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executors.namespace import ENTER, INSIDE, loopback_namespace

ROOT = Path(__file__).resolve().parents[2]


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
    if child.returncode != 0:
        pytest.fail(f"the Ray tests failed:\n{child.stdout[-12000:]}\n{child.stderr[-4000:]}")
