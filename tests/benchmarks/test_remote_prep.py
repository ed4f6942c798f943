"""``python -m benchmarks.remote_prep --smoke`` runs every feed (the step alone, a local
worker, a Ray actor) and both hand-offs inside its loopback-only namespace and reports
finite figures. No speed is asserted: a smoke run is far too small for that."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.executors.namespace import INSIDE, loopback_namespace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_remote_prep_smoke(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'concurrent-loader[ray]')")
    if (why := loopback_namespace()) is not None:
        pytest.skip(f"Ray may only start on loopback here, in a network namespace: {why}")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the benchmark pins the trainer and the actor to two different CPUs")
    env = {k: v for k, v in os.environ.items() if k not in (INSIDE, "RAY_ADDRESS")}
    command = [sys.executable, "-m", "benchmarks.remote_prep", "--smoke", "--json"]
    run = subprocess.run(
        [*command, "--data-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    for feed in ("synthetic", "local", "ray"):
        rate = results[f"{feed}_steps_per_s"]
        assert math.isfinite(rate) and rate > 0, (feed, rate)
    for feed in ("local", "ray"):
        cost = results[f"handoff_{feed}"]
        assert all(math.isfinite(v) and v > 0 for v in cost.values()), (feed, cost)
    assert results["trainer_cpu"] not in results["actor_cpus"]
