"""PyTorch Lightning with ConcurrentDataLoader: DDP on CPU over 2 ranks reading the local S3
server. Lightning rebuilds the loader with a ``DistributedSampler`` from its arguments (so
they must be the user's), calls ``set_epoch`` on ``loader.sampler``, and saves the loader's
``state_dict`` in its checkpoints: every sample is seen exactly once per epoch across the
ranks, and a run resumed from a mid-epoch checkpoint trains on exactly the batches the
uninterrupted run trained on after that point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

pytestmark = [pytest.mark.framework, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("lightning_fit.py")
REPO = Path(__file__).parents[2]


def run(url: str, out: Path, name: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), url, str(out), name],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]


def batches(out: Path, name: str, rank: int) -> list[dict[str, Any]]:
    path = out / f"{name}-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ddp_fit_sees_every_sample_once_per_epoch_and_resumes_mid_epoch(
    image_dataset, s3_env, tmp_path
):
    url = image_dataset.s3_url
    run(url, tmp_path, "full")
    every = json.loads((tmp_path / "dataset.json").read_text())
    assert len(set(every)) == len(every) == 24
    full = [batches(tmp_path, "full", rank) for rank in (0, 1)]
    for epoch in (0, 1):
        seen = Counter(
            s for rank in full for b in rank if b["epoch"] == epoch for s in b["samples"]
        )
        assert seen == Counter(every), f"epoch {epoch}: not every sample exactly once"
    orders = [[b["samples"] for b in full[0] if b["epoch"] == e] for e in (0, 1)]
    assert orders[0] != orders[1]  # reshuffled per epoch (set_epoch reached the sampler)

    run(url, tmp_path, "interrupt")
    assert (tmp_path / "checkpoints" / "epoch=0-step=2.ckpt").exists()
    run(url, tmp_path, "resume")
    for rank in (0, 1):
        interrupted = batches(tmp_path, "interrupt", rank)
        assert interrupted == full[rank][:3]
        resumed = batches(tmp_path, "resume", rank)
        # Trained after the checkpoint: the uninterrupted run's batches from the third on.
        assert resumed == full[rank][2:]
