"""The epoch's batches, drawn in the main process and shared with every worker."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import ConfigError, Reason

__all__ = ["EpochPlan"]


class EpochPlan:
    """The epoch's batches in shared memory, so every worker (also persistent ones) reads them.

    ``indices[offsets[b]:offsets[b+1]]`` is batch ``b``; ``count[0]`` batches are valid.
    Worker ``w`` of ``W`` produces batches ``w, w+W, ...``: torch's in-order round robin over
    workers then hands them back as ``0, 1, 2, ...``.
    """

    def __init__(self) -> None:
        self.count = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.indices = torch.zeros(0, dtype=torch.int64).share_memory_()
        self.offsets = torch.zeros(1, dtype=torch.int64).share_memory_()

    def write(
        self,
        batches: Sequence[Sequence[int]],
        *,
        may_grow: bool,
        room: tuple[int, int] = (0, 0),
    ) -> None:
        """Write ``batches``; when buffers are (re)made, size them for at least ``room``
        (samples, batches): a resumed epoch writes only its rest, later epochs all of it.

        Persistent workers keep the buffers they were started with, so then (``may_grow``
        False) the plan cannot outgrow them."""
        flat = [int(i) for batch in batches for i in batch]
        if len(flat) > self.indices.numel() or len(batches) + 1 > self.offsets.numel():
            if not may_grow:
                raise ConfigError(
                    "the sampler yields more samples this epoch than in the first one, which "
                    "persistent_workers=True cannot take: use persistent_workers=False",
                    cause=Reason.INVALID_ARGUMENT,
                )
            samples, count = max(len(flat), room[0]), max(len(batches), room[1])
            self.indices = torch.zeros(samples, dtype=torch.int64).share_memory_()
            self.offsets = torch.zeros(count + 1, dtype=torch.int64).share_memory_()
        sizes = torch.tensor([len(b) for b in batches], dtype=torch.int64)
        self.offsets[0] = 0
        torch.cumsum(sizes, 0, out=self.offsets[1 : len(batches) + 1])
        self.indices[: len(flat)] = torch.tensor(flat, dtype=torch.int64)
        self.count[0] = len(batches)

    def batches_for(self, worker: int, num_workers: int) -> list[list[int]]:
        count = int(self.count[0])
        offsets = self.offsets[: count + 1].tolist()
        indices = self.indices
        return [
            indices[offsets[b] : offsets[b + 1]].tolist() for b in range(worker, count, num_workers)
        ]
