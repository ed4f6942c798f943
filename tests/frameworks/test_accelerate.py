"""Hugging Face Accelerate with ConcurrentDataLoader on 2 CPU processes (gloo, started by
``torch.distributed.run``), reading the local S3 server.

``accelerator.prepare(loader)`` rebuilds a plain DataLoader from the loader's public
attributes (``dataset``, ``batch_sampler``, ``collate_fn``, ``num_workers``, ...), so they
must be the user's: every sample is then seen exactly once per epoch across the ranks. A
loader left unprepared shards itself under the process group Accelerate set up, with the
same coverage, and keeps its concurrent fetching.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

pytestmark = [pytest.mark.framework, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("accelerate_fit.py")
REPO = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_prepared_and_unprepared_loaders_see_every_sample_once_per_epoch(
    image_dataset, s3_env, tmp_path
):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(SCRIPT),
        image_dataset.s3_url,
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    every = Counter(json.loads((tmp_path / "dataset.json").read_text()))
    assert len(every) == 24
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # What Accelerate iterates is a stock DataLoader built from our attributes.
    assert ranks[0]["prepared_base"] == "DataLoader"
    for name in ("prepared", "own"):
        for epoch in (0, 1):
            seen = Counter(s for rank in ranks for s in rank[name][epoch])
            assert seen == every, f"{name}, epoch {epoch}: not every sample exactly once"
        assert ranks[0][name][0] != ranks[0][name][1]  # reshuffled per epoch
    # The unprepared loader fetched its own share (one GET per sample and epoch).
    assert [rank["own_requests"] for rank in ranks] == [24, 24]
