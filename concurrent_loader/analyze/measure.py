"""The measurements of ``analyze``, each bounded in time: a loader run for a time share
(its first batch, which includes starting workers and connections, not counted), and the
decode of bytes already in memory on a number of threads.

Every run goes through the loader itself (``ConcurrentDataLoader`` over the dataset), so a
figure is what the loader reaches, not what a bare client would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ..loader import ConcurrentDataLoader

__all__ = ["Run", "decode_rate", "object_size", "run_loader"]


def object_size(data: bytes | bytearray | memoryview) -> int:
    """The fetch-only "decode": an object's length (the bytes are fetched, nothing made)."""
    return len(data)


@dataclass(frozen=True)
class Run:
    """``samples`` (and ``bytes``, when the batches are object sizes) in ``seconds``, after
    the first batch; ``stats``: the loader's ``stats()`` at the end; ``inflight``: the
    requests in flight per process at the end (``loader.tuning``: self-tuned or pinned)."""

    samples: int
    bytes: int
    seconds: float
    stats: dict[str, Any]
    inflight: int | None = None

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


def _size_of(batch: Any) -> tuple[int, int]:
    """(samples, bytes) of a batch: object sizes (a tensor), (images, labels), or a list."""
    if isinstance(batch, torch.Tensor):
        return len(batch), int(batch.sum()) if batch.dtype == torch.int64 else 0
    if isinstance(batch, tuple | list) and batch and isinstance(batch[0], torch.Tensor):
        return len(batch[0]), 0
    return len(batch), 0


def run_loader(
    dataset: Any,
    *,
    seconds: float,
    batch_size: int,
    workers: int,
    decode_threads: int,
    stall_timeout_s: float,
    seed: int = 0,
    on_batch: Callable[[Any], None] | None = None,
) -> Run:
    """Shuffled epochs of ``dataset`` until ``seconds`` have passed after the first batch
    (at least one batch after it); ``on_batch`` is called after each batch (a training step)."""
    loader = ConcurrentDataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        decode_threads=decode_threads,
        generator=torch.Generator().manual_seed(seed),
        stall_timeout_s=stall_timeout_s,
    )
    samples = nbytes = 0
    started: float | None = None
    now = time.perf_counter()
    while started is None or now - started < seconds or samples == 0:
        epoch = iter(loader)
        try:
            for batch in epoch:
                now = time.perf_counter()
                if started is None:
                    started = now
                else:
                    count, size = _size_of(batch)
                    samples += count
                    nbytes += size
                if on_batch is not None:
                    on_batch(batch)
                if now - started >= seconds and samples > 0:
                    break
        finally:
            epoch.close()  # type: ignore[attr-defined]
    inflight = loader.tuning["max_inflight_requests"]
    return Run(samples, nbytes, now - (started or now), loader.stats(), inflight)


def decode_rate(
    decode: Callable[[bytes, str], Any],
    bodies: Sequence[tuple[bytes, str]],
    threads: int,
    seconds: float,
) -> float:
    """Samples/s of ``threads`` threads decoding ``bodies`` (bytes, url) round and round for
    ``seconds`` (each thread finishes the sample it is on)."""
    if not bodies:
        raise ValueError("no bodies to decode")
    done = [0] * threads
    stop = threading.Event()

    def lane(lane_index: int) -> None:
        i = lane_index
        while not stop.is_set():
            data, url = bodies[i % len(bodies)]
            decode(data, url)
            done[lane_index] += 1
            i += threads

    with ThreadPoolExecutor(threads, thread_name_prefix="analyze-decode") as pool:
        started = time.perf_counter()
        lanes = [pool.submit(lane, n) for n in range(threads)]
        stop.wait(seconds)
        stop.set()
        for future in lanes:
            future.result()
        elapsed = time.perf_counter() - started
    return sum(done) / elapsed
