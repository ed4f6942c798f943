"""The code blocks of README.md's "## Training" section run, and print what they claim.

The convention (stated in that section): the examples read ``s3://my-bucket/train/`` with
the endpoint and credentials of the standard AWS chain. Here the local S3 server holds the
test images at that address and ``AWS_ENDPOINT_URL`` and keys point at it. Every fenced
block of a subsection runs in order, each in a new process, in one scratch directory:

- ```` ```python ````: as a script; one whose first line says ``torchrun
  --nproc-per-node=N`` is launched that way (``python -m torch.distributed.run``);
- ```` ```bash ````: line by line, ``concurrent-loader`` being the package's entry point
  (run as ``python -m concurrent_loader``, which calls the same ``main``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BUCKET = "my-bucket"
PREFIX = "train/"
SUBSECTIONS = ("Distributed (DDP)", "Exact mid-epoch resume", "Live metrics", "Command line")


def training_blocks() -> dict[str, list[tuple[str, str]]]:
    """``{subsection title: [(language, code), ...]}`` of README's "## Training" section."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^## Training\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "README.md has no '## Training' section"
    parts = re.split(r"^### (.+)\n", match.group(1), flags=re.M)
    return {
        title.strip(): re.findall(r"^```(\w+)\n(.*?)^```\s*$", body, flags=re.M | re.S)
        for title, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def test_the_section_has_its_subsections_with_examples():
    blocks = training_blocks()
    assert tuple(blocks) == SUBSECTIONS
    for title, found in blocks.items():
        assert any(language == "python" for language, _ in found), title
        assert all(language in ("python", "bash") for language, _ in found), title


@pytest.fixture
def example_env(image_dataset, s3_server, tmp_path) -> dict[str, str]:
    """The test images at s3://my-bucket/train/, and an environment that points there."""
    s3_server.create_bucket(BUCKET)
    s3_server.upload_dir(image_dataset.local_root, BUCKET, prefix=PREFIX)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3_server.env())
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def run_block(language: str, code: str, cwd: Path, env: dict[str, str], n: int) -> str:
    """Run one block as described in the module docstring; return its stdout + stderr."""
    if language == "python":
        script = cwd / f"block{n}.py"
        script.write_text(code, encoding="utf-8")
        launch = re.search(r"torchrun --nproc-per-node=(\d+)", code.splitlines()[0])
        if launch:
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            commands = [[*torchrun, f"--nproc-per-node={launch.group(1)}", str(script)]]
        else:
            commands = [[sys.executable, str(script)]]
    else:
        commands = []
        for line in code.splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            assert argv[0] == "concurrent-loader", f"unexpected command in README: {line}"
            commands.append([sys.executable, "-m", "concurrent_loader", *argv[1:]])
    output = ""
    for command in commands:
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
        output += result.stdout + result.stderr
        assert result.returncode == 0, f"{shlex.join(command)} failed:\n{output}"
    return output


def run_subsection(title: str, env: dict[str, str], cwd: Path) -> str:
    return "".join(
        run_block(language, code, cwd, env, n)
        for n, (language, code) in enumerate(training_blocks()[title])
    )


def test_distributed_example(example_env, tmp_path):
    out = run_subsection("Distributed (DDP)", example_env, tmp_path)
    # 24 images over 2 ranks: 12 each, in both epochs.
    for rank in (0, 1):
        for epoch in (0, 1):
            assert f"rank {rank} epoch {epoch}: 12 images" in out, out


def test_resume_example(example_env, tmp_path):
    out = run_subsection("Exact mid-epoch resume", example_env, tmp_path)
    assert (tmp_path / "checkpoint.pt").exists()
    # 24 images in batches of 8; the first was taken before the checkpoint.
    assert "resumed with 2 of 3 batches left" in out, out


def test_metrics_example(example_env, tmp_path):
    out = run_subsection("Live metrics", example_env, tmp_path)
    assert re.search(
        r"^24 GETs, \d+ bytes, GET p99 [\d.]+ s, wait p95 [\d.]+ s per batch$", out, re.M
    ), out
    assert re.search(r"^(storage|decode|loader|training step): ", out, re.M), out


def test_command_line_example(example_env, tmp_path):
    out = run_subsection("Command line", example_env, tmp_path)
    assert "wrote 24 samples in 1 shards" in out, out
    assert "objects: 24" in out, out
    assert "images:  24 in 3 classes" in out, out
    assert (tmp_path / "train.txt").read_text().count("\n") == 24
    assert "24 ['apple', 'banana', 'cherry']" in out, out
