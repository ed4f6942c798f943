"""CUDAPrefetcher on a real GPU: streams, pinned staging, buffer lifetimes and overlap.

The lifetime tests queue slow kernels on purpose, so that a buffer or device tensor recycled
too early would be overwritten before the kernels that read it run: each batch carries its
own constant value, and the values read back on the GPU must match.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from concurrent_loader.gpu import CUDAPrefetcher, StallMeter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs CUDA: checks copy streams, pinned staging and copy/compute overlap",
    ),
    pytest.mark.usefixtures("no_new_threads"),
]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def reference(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (x.float() / 255 - mean) / std


def value_of(i: int) -> int:
    """A distinct uint8 value per batch (0 is skipped: fresh memory is often zero)."""
    return i % 255 + 1


def constant_batches(n: int, shape: tuple[int, ...]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Unpinned batches, so each goes through the pinned ring."""
    for i in range(n):
        yield torch.full(shape, value_of(i), dtype=torch.uint8), torch.full((shape[0],), i)


def busy(matrix: torch.Tensor, times: int) -> torch.Tensor:
    """Queue ``times`` matmuls on the current stream (a slow kernel, without private API)."""
    out = matrix
    for _ in range(times):
        out = matrix @ matrix
    return out


def seconds(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``fn`` over ``repeat`` runs, device work included."""
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def read_back(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Min and max of both tensors, computed on the current stream; read later."""
    return torch.stack([images.amin().long(), images.amax().long(), labels.amin(), labels.amax()])


def check_read_back(results: list[torch.Tensor]) -> None:
    torch.cuda.synchronize()
    for i, result in enumerate(results):
        v = value_of(i)
        assert result.tolist() == [v, v, i, i], f"batch {i} was overwritten: {result.tolist()}"


def test_batches_arrive_on_the_gpu_normalised_and_in_order() -> None:
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8, generator=g), torch.arange(8) + i)
        for i in range(6)
    ]
    prefetcher = CUDAPrefetcher(
        batches, device="cuda", mean=MEAN, std=STD, channels_last=True, dtype=torch.bfloat16
    )
    out = list(prefetcher)
    assert len(out) == len(batches)
    for (images, labels), (got_images, got_labels) in zip(batches, out, strict=True):
        assert got_images.is_cuda and got_labels.is_cuda
        assert got_images.dtype == torch.bfloat16
        assert got_images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(
            got_images.float().cpu(), reference(images), rtol=1e-2, atol=2e-2
        )
        assert torch.equal(got_labels.cpu(), labels)


def test_already_pinned_batches_are_copied_straight_from() -> None:
    images = torch.randint(0, 256, (20, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(20)
    loader = DataLoader(TensorDataset(images, labels), batch_size=4, pin_memory=True)
    it = iter(CUDAPrefetcher(loader, device="cuda", mean=MEAN, std=STD))
    out = list(it)
    assert it.pinned_allocations == 0
    got = torch.cat([b[0] for b in out]).cpu()
    torch.testing.assert_close(got, reference(images), rtol=0, atol=1e-5)
    assert torch.equal(torch.cat([b[1] for b in out]).cpu(), labels)


def test_device_tensors_are_not_recycled_while_the_consumer_still_reads_them() -> None:
    # The loop drops each batch on the host at once, while its reads are still queued
    # behind slow kernels: without record_stream the allocator would hand the memory to
    # the copy of a later batch, and the delayed reads would see that batch's values.
    matrix = torch.randn(2048, 2048, device="cuda")
    results = []
    source = constant_batches(32, (16, 3, 128, 128))
    for images, labels in CUDAPrefetcher(source, device="cuda", depth=1):
        busy(matrix, 8)
        results.append(read_back(images, labels))
        del images, labels
    check_read_back(results)


def test_a_ring_slot_is_not_rewritten_while_its_copy_is_pending() -> None:
    # The source runs on the producer thread, whose current stream is the copy stream:
    # queueing slow kernels there holds every copy back, so the producer comes round to
    # a slot whose copy has not run yet. It must wait for that copy instead of overwriting
    # the slot, or the first batches would arrive with later batches' values.
    matrix = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()  # the copy stream reads it without waiting on its producer
    copy_streams = []

    def source() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        copy_streams.append(torch.cuda.current_stream())
        busy(matrix, 40)
        yield from constant_batches(12, (8, 3, 64, 64))

    results = []
    for images, labels in CUDAPrefetcher(source(), device="cuda", depth=1):
        results.append(read_back(images, labels))
    assert copy_streams[0] != torch.cuda.default_stream()
    check_read_back(results)


def test_the_loop_may_run_on_its_own_stream() -> None:
    matrix = torch.randn(2048, 2048, device="cuda")
    results = []
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for images, labels in CUDAPrefetcher(constant_batches(16, (8, 3, 64, 64)), device="cuda"):
            busy(matrix, 4)
            results.append(read_back(images, labels))
    side.synchronize()
    check_read_back(results)


def test_pinned_memory_stays_bounded_over_many_batches() -> None:
    depth = 2
    full, last = (32, 3, 64, 64), (5, 3, 64, 64)

    def source() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(4):
            yield from constant_batches(49, full)
            yield from constant_batches(1, last)  # a smaller last batch per epoch

    it = iter(CUDAPrefetcher(source(), device="cuda", depth=depth))
    bound = (depth + 1) * (32 * 3 * 64 * 64 + 32 * 8)
    allocations_after_warmup = host_allocs_after_warmup = None
    for i, _ in enumerate(it):
        assert it.pinned_bytes <= bound
        if i == 2 * (depth + 1):
            allocations_after_warmup = it.pinned_allocations
            host_allocs_after_warmup = torch.cuda.host_memory_stats().get("num_host_alloc")
    assert it.pinned_allocations == allocations_after_warmup == 2 * (depth + 1)
    assert torch.cuda.host_memory_stats().get("num_host_alloc") == host_allocs_after_warmup
    assert it.pinned_bytes == 0  # freed when the pass ended


def test_copies_overlap_compute() -> None:
    # Copy-only and compute-only runs of about the same length; run together they must
    # take clearly less than their sum (ideally about the longer of the two).
    n = 24
    pinned = torch.randint(0, 256, (64, 3, 512, 512), dtype=torch.uint8).pin_memory()
    batches = [(pinned, torch.arange(64))] * n
    # Small matmuls, so that the compute per step can be matched to the copy time closely.
    matrix = torch.randn(2048, 2048, device="cuda")
    busy(matrix, 3)  # cuBLAS start-up

    def copy_only() -> None:
        for _ in CUDAPrefetcher(batches, device="cuda", depth=2):
            pass

    one_matmul = seconds(lambda: busy(matrix, 10)) / 10
    copy_s = seconds(copy_only)
    per_step = max(1, round(copy_s / n / one_matmul))

    def compute_only() -> None:
        for _ in range(n):
            busy(matrix, per_step)

    def both() -> None:
        for images, _ in CUDAPrefetcher(batches, device="cuda", depth=2):
            busy(matrix, per_step)
            images.amax()

    compute_s = seconds(compute_only)
    both_s = seconds(both)
    assert both_s < 0.8 * (copy_s + compute_s), (copy_s, compute_s, both_s)


def test_break_frees_the_ring_and_the_thread() -> None:
    prefetcher = CUDAPrefetcher(constant_batches(100, (8, 3, 32, 32)), device="cuda", depth=3)
    it = iter(prefetcher)
    for i, _ in enumerate(it):
        if i == 5:
            assert it.pinned_bytes > 0
            assert prefetcher.pinned_bytes == it.pinned_bytes
            break
    it.close()
    assert it.pinned_bytes == 0
    assert prefetcher.pinned_bytes == 0


def test_stall_meter_counts_queued_gpu_work_as_compute() -> None:
    matrix = torch.randn(4096, 4096, device="cuda")
    busy(matrix, 3)
    step_s = seconds(lambda: busy(matrix, 10))
    batches = [matrix] * 5
    meter = StallMeter(device="cuda")
    for _ in meter.iterate(batches):
        busy(matrix, 10)  # returns long before the GPU is done
    report = meter.report()
    assert report.mean_compute_s > 0.7 * step_s
    assert report.stall_share < 0.2


def test_sparse_leaves_are_moved_too() -> None:
    sparse = torch.eye(4).to_sparse()
    batch = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), sparse, "name")
    ((images, got_sparse, name),) = list(CUDAPrefetcher([batch], device="cuda", mean=MEAN, std=STD))
    assert images.is_cuda and got_sparse.is_cuda and got_sparse.is_sparse
    assert torch.equal(got_sparse.to_dense().cpu(), torch.eye(4))
    assert name == "name"
