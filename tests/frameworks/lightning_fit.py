"""A Lightning DDP run on CPU (``Trainer(strategy="ddp", accelerator="cpu", devices=2)``)
with ConcurrentDataLoader from ``train_dataloader()``; run as a script by
``test_lightning.py``. Lightning starts rank 1 by running this script again.

Each rank appends one JSON line per training batch to ``<out>/<run>-rank<r>.jsonl``:
the epoch, the batch index and the fingerprints (SHA-256 of image bytes and label) of its
samples. ``run``: ``full`` (2 epochs), ``interrupt`` (stops after 3 steps, with a
checkpoint after step 2) or ``resume`` (from that checkpoint to the end of 2 epochs).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder


def fingerprint(image: torch.Tensor, label: Any) -> str:
    return hashlib.sha256(
        image.contiguous().numpy().tobytes() + str(int(label)).encode()
    ).hexdigest()


class Model(L.LightningModule):
    def __init__(self, url: str, out: Path, run: str) -> None:
        super().__init__()
        self.url, self.out, self.run = url, out, run
        self.layer = torch.nn.Linear(3 * 24 * 24, 3)

    def train_dataloader(self) -> ConcurrentDataLoader[Any]:
        fetch_config = FetchConfig(max_inflight_requests=8)
        dataset = ImageFolder(self.url, image_size=24, fetch_config=fetch_config)
        return ConcurrentDataLoader(dataset, batch_size=2, shuffle=True, num_workers=1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        line = {
            "epoch": self.current_epoch,
            "batch": batch_idx,
            "samples": [fingerprint(i, y) for i, y in zip(images, labels, strict=True)],
        }
        with open(self.out / f"{self.run}-rank{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        logits = self.layer(images.float().flatten(1) / 255)
        return torch.nn.functional.cross_entropy(logits, labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    url, out, run = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    L.seed_everything(0, workers=True)
    checkpoints = out / "checkpoints"
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        max_steps=3 if run == "interrupt" else -1,
        callbacks=[ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=2, save_top_k=-1)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    ckpt = str(checkpoints / "epoch=0-step=2.ckpt") if run == "resume" else None
    trainer.fit(Model(url, out, run), ckpt_path=ckpt)
    if run == "full" and trainer.global_rank == 0:
        dataset = ImageFolder(url, image_size=24)
        every = [fingerprint(*dataset[i]) for i in range(len(dataset))]
        (out / "dataset.json").write_text(json.dumps(every))
    os.environ.pop("unused", None)


if __name__ == "__main__":
    main()
