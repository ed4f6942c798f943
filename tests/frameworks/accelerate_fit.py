"""Hugging Face Accelerate on 2 CPU processes (gloo), started by ``torch.distributed.run``;
run as a script by ``test_accelerate.py``.

Each rank trains 2 epochs from ``accelerator.prepare(loader)`` of a ConcurrentDataLoader,
then 2 epochs from a ConcurrentDataLoader left unprepared (it shards by itself under
torch.distributed), and writes ``<out>/rank<r>.json``: per loader, per epoch, the
fingerprints (SHA-256 of image bytes and label) of the samples it trained on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ImageFolder


def fingerprint(image: torch.Tensor, label: Any) -> str:
    data = image.contiguous().numpy().tobytes() + str(int(label)).encode()
    return hashlib.sha256(data).hexdigest()


def train(accelerator: Accelerator, loader: Any, model: Any, optimizer: Any) -> list[list[str]]:
    seen = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        samples = []
        for images, labels in loader:
            samples += [fingerprint(i, y) for i, y in zip(images, labels, strict=True)]
            loss = torch.nn.functional.cross_entropy(model(images.float().flatten(1) / 255), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        seen.append(samples)
    return seen


def main() -> None:
    url, out = sys.argv[1], Path(sys.argv[2])
    accelerator = Accelerator(cpu=True)
    dataset = ImageFolder(url, image_size=24, fetch_config=FetchConfig(max_inflight_requests=8))
    loader = ConcurrentDataLoader(dataset, batch_size=2, shuffle=True, num_workers=1)
    model = torch.nn.Linear(3 * 24 * 24, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    result: dict[str, Any] = {
        "prepared_base": type(prepared.base_dataloader).__name__,
        "prepared": train(accelerator, prepared, model, optimizer),
    }
    own = ConcurrentDataLoader(dataset, batch_size=2, shuffle=True, seed=3, num_workers=1)
    result["own"] = train(accelerator, own, model, optimizer)
    result["own_requests"] = own.stats()["requests"]
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    if accelerator.is_main_process:
        every = [fingerprint(*dataset[i]) for i in range(len(dataset))]
        (out / "dataset.json").write_text(json.dumps(every))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
