from __future__ import annotations

import pytest
import torch

from concurrent_loader.errors import ConfigError
from concurrent_loader.gpu.transfer import PinnedRing


class FakeFence:
    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name

    def synchronize(self) -> None:
        self.log.append(self.name)


def test_needs_a_slot() -> None:
    with pytest.raises(ConfigError):
        PinnedRing(0, pin=False)


def test_staging_buffer_has_the_tensor_shape_and_dtype() -> None:
    ring = PinnedRing(2, pin=False)
    slot = ring.acquire()
    like = torch.zeros(4, 3, 2, dtype=torch.float32)
    buf = slot.staging(like)
    assert buf.shape == like.shape and buf.dtype == like.dtype and buf.is_contiguous()
    labels = slot.staging(torch.zeros(4, dtype=torch.int64))
    assert labels.shape == (4,) and labels.dtype == torch.int64
    assert ring.pinned_bytes == 4 * 3 * 2 * 4 + 4 * 8
    assert ring.allocations == 2


def test_buffers_are_reused_around_the_ring_and_grow_only_when_needed() -> None:
    ring = PinnedRing(2, pin=False)
    big, small, bigger = torch.zeros(8, 3), torch.zeros(2, 3), torch.zeros(16, 3)
    ptrs = []
    for _ in range(2):
        ptrs.append(ring.acquire().staging(big).data_ptr())
    assert ring.allocations == 2
    for i in range(6):
        assert ring.acquire().staging(big).data_ptr() == ptrs[i % 2]
    # A smaller last batch fits in the same buffer.
    assert ring.acquire().staging(small).data_ptr() == ptrs[0]
    assert ring.allocations == 2
    assert ring.pinned_bytes == 2 * big.numel() * 4
    # A larger one replaces it; the bytes bound follows the largest shape seen.
    ring.acquire().staging(bigger)
    assert ring.allocations == 3
    assert ring.pinned_bytes == (bigger.numel() + big.numel()) * 4


def test_a_slot_is_reused_only_after_its_fence_and_then_releases_what_it_kept() -> None:
    log: list[str] = []
    ring = PinnedRing(2, pin=False)
    kept = torch.zeros(1)
    first = ring.acquire()
    first.keep(kept)
    first.release(FakeFence(log, "copy 0"))
    second = ring.acquire()
    second.release(FakeFence(log, "copy 1"))
    assert log == []  # no wait while the other slot was free
    assert first._keep_alive == [kept]
    again = ring.acquire()
    assert again is first
    assert log == ["copy 0"]
    assert first._keep_alive == []


def test_close_waits_for_every_copy_and_frees_buffers() -> None:
    log: list[str] = []
    ring = PinnedRing(2, pin=False)
    for i in range(2):
        slot = ring.acquire()
        slot.staging(torch.zeros(10))
        slot.release(FakeFence(log, f"copy {i}"))
    ring.close()
    assert sorted(log) == ["copy 0", "copy 1"]
    assert ring.pinned_bytes == 0


def test_zero_size_and_bool_tensors_can_be_staged() -> None:
    slot = PinnedRing(1, pin=False).acquire()
    assert slot.staging(torch.zeros(0, 3)).shape == (0, 3)
    flags = slot.staging(torch.zeros(5, dtype=torch.bool))
    assert flags.dtype == torch.bool and flags.shape == (5,)
    scalar = slot.staging(torch.tensor(1.5))
    assert scalar.shape == ()
