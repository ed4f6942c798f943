"""examples/notebook.ipynb runs headless in a real Jupyter kernel (nbclient + ipykernel),
where an asyncio loop already runs in the notebook's thread, and shows what it promises:
an image grid and the loader's live metrics, with no error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "notebook.ipynb"


def execute(tmp_path: Path) -> list[dict]:
    """Run every cell in a fresh kernel (working directory ``tmp_path``); return the outputs."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    return [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]


def text_of(outputs: list[dict]) -> str:
    parts = []
    for out in outputs:
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out and "text/plain" in out["data"]:
            parts.append(out["data"]["text/plain"])
    return "".join(parts)


def kernel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel inherits this environment: the package importable from the checkout, the
    default inline plotting backend, and no AWS setup (the notebook starts its own server)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.delenv("MPLBACKEND", raising=False)
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), path])))


def check(outputs: list[dict]) -> str:
    assert not [out for out in outputs if out["output_type"] == "error"]
    images = [
        out
        for out in outputs
        if out["output_type"] == "display_data" and "image/png" in out.get("data", {})
    ]
    assert len(images) == 1  # the grid
    text = text_of(outputs)
    # The condition this example exists to show: a loop already runs in the cell's thread.
    assert "an asyncio event loop is running in this thread" in text
    assert "uploaded 48 images" in text
    assert "batch 2: images (16, 3, 64, 64) torch.uint8" in text
    for name in ("requests", "bytes", "get_latency_s", "wait_s_per_batch", "verdict"):
        assert f"{name}:" in text, name
    assert "requests: 48" in text  # merged over the two worker processes
    return text


@pytest.mark.slow
def test_notebook_runs_with_its_own_server(tmp_path, monkeypatch):
    kernel_env(monkeypatch)
    text = check(execute(tmp_path))
    assert "endpoint: http://127.0.0.1:" in text


def test_notebook_uses_aws_endpoint_url(tmp_path, monkeypatch, s3_server):
    kernel_env(monkeypatch)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    text = check(execute(tmp_path))
    assert f"endpoint: {s3_server.endpoint_url}" in text
