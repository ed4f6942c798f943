"""CUDAPrefetcher on the CPU: what every machine (and CI) can check.

The producer thread, read-ahead bound, ordering, error propagation and shutdown are the
same code on every device; only the transfer differs (see test_cuda.py for CUDA).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from concurrent_loader.errors import ConfigError
from concurrent_loader.gpu import CUDAPrefetcher
from concurrent_loader.gpu.prefetch import PrefetchIterator

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

pytestmark = pytest.mark.usefixtures("no_new_threads")


def reference(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    return (x.float() / 255 - mean) / std


def image_batches(n: int, batch: int = 4, size: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=g),
            torch.arange(batch) + i * batch,
        )
        for i in range(n)
    ]


class Closed:
    """A generator source that records whether it was closed (its finally ran)."""

    def __init__(self, items: list[Any], fail_at: int | None = None) -> None:
        self.items = items
        self.fail_at = fail_at
        self.closed = False
        self.pulled = 0

    def __iter__(self) -> Iterator[Any]:
        try:
            for i, item in enumerate(self.items):
                if i == self.fail_at:
                    raise KeyError(f"bad sample {i}")
                self.pulled += 1
                yield item
        finally:
            self.closed = True


def cpu(source: Any, **kwargs: Any) -> CUDAPrefetcher:
    return CUDAPrefetcher(source, device="cpu", **kwargs)


# -- values and order ------------------------------------------------------------------


def test_yields_normalised_images_and_untouched_labels_in_order() -> None:
    batches = image_batches(7)
    out = list(cpu(batches, mean=MEAN, std=STD))
    assert len(out) == len(batches)
    for (images, labels), (got_images, got_labels) in zip(batches, out, strict=True):
        assert got_images.dtype == torch.float32
        torch.testing.assert_close(got_images, reference(images), rtol=0, atol=1e-5)
        assert torch.equal(got_labels, labels)


def test_without_mean_and_std_batches_pass_through_unchanged() -> None:
    batches = image_batches(3)
    for (images, labels), (got_images, got_labels) in zip(batches, cpu(batches), strict=True):
        assert got_images.dtype == torch.uint8
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)


def test_dtype_and_channels_last() -> None:
    batches = image_batches(2)
    prefetcher = cpu(batches, mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True)
    for (images, _), (got, _) in zip(batches, prefetcher, strict=True):
        assert got.dtype == torch.bfloat16
        assert got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.float(), reference(images), rtol=1e-2, atol=2e-2)


def test_nested_structures_and_non_tensor_leaves() -> None:
    image = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    mask = torch.randint(0, 2, (2, 3, 4, 4), dtype=torch.uint8)
    batch = (
        {"image": image, "mask": mask, "names": ["a.jpg", "b.jpg"]},
        [torch.tensor([1, 2]), "tag", 3.5],
    )
    (got,) = list(cpu([batch], mean=MEAN, std=STD))
    # A tuple's first element is a dict, not an image: nothing below the top level is
    # normalised by default.
    assert torch.equal(got[0]["image"], image)
    assert torch.equal(got[0]["mask"], mask)
    assert got[0]["names"] == ["a.jpg", "b.jpg"]
    assert torch.equal(got[1][0], torch.tensor([1, 2]))
    assert got[1][1:] == ["tag", 3.5]


def test_dict_batches_normalise_the_image_key_only() -> None:
    image = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    mask = torch.randint(0, 2, (2, 3, 4, 4), dtype=torch.uint8)
    (got,) = list(cpu([{"image": image, "mask": mask, "id": "x"}], mean=MEAN, std=STD))
    torch.testing.assert_close(got["image"], reference(image), rtol=0, atol=1e-5)
    assert torch.equal(got["mask"], mask)
    assert got["id"] == "x"


def test_normalize_key_is_configurable() -> None:
    image = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    batch = ("meta", image)
    (got,) = list(cpu([batch], mean=MEAN, std=STD, normalize_key=1))
    torch.testing.assert_close(got[1], reference(image), rtol=0, atol=1e-5)
    (untouched,) = list(cpu([(image,)], mean=MEAN, std=STD, normalize_key=None))
    assert torch.equal(untouched[0], image)


def test_bare_tensor_batches_are_images() -> None:
    image = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    (got,) = list(cpu([image], mean=MEAN, std=STD))
    torch.testing.assert_close(got, reference(image), rtol=0, atol=1e-5)


def test_works_over_a_stock_dataloader() -> None:
    images = torch.randint(0, 256, (10, 3, 4, 4), dtype=torch.uint8)
    labels = torch.arange(10)
    loader = DataLoader(TensorDataset(images, labels), batch_size=4)
    prefetcher = cpu(loader, mean=MEAN, std=STD, channels_last=True)
    assert len(prefetcher) == 3
    out = list(prefetcher)
    torch.testing.assert_close(torch.cat([b[0] for b in out]), reference(images), rtol=0, atol=1e-5)
    assert torch.equal(torch.cat([b[1] for b in out]), labels)


class Squares(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3, 2, 2), index, dtype=torch.uint8), index


# torch forks its workers from the producer thread; newer Pythons warn about any fork
# in a multi-threaded process, which is harmless for DataLoader workers.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_works_over_a_dataloader_with_worker_processes_and_shuts_them_down() -> None:
    loader = DataLoader(Squares(), batch_size=3, num_workers=2)
    out = list(cpu(loader))
    assert [int(b[0][i, 0, 0, 0]) for b in out for i in range(3)] == list(range(12))
    it = iter(cpu(loader))
    next(it)
    it.close()


def test_epochs_and_concurrent_passes_are_independent() -> None:
    batches = image_batches(4)
    prefetcher = cpu(batches, mean=MEAN, std=STD)
    first = [b[1] for b in prefetcher]
    second = [b[1] for b in prefetcher]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    pairs = list(zip(prefetcher, prefetcher, strict=True))
    assert all(torch.equal(a[1], b[1]) for a, b in pairs)


def test_len_follows_the_source() -> None:
    assert len(cpu([1, 2, 3])) == 3
    with pytest.raises(TypeError, match="no len"):
        len(cpu(iter([1, 2, 3])))


# -- read-ahead bound -------------------------------------------------------------------


class Counting:
    """Counts pulls and lets the test wait until a number of pulls has happened."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pulled = 0
        self.changed = threading.Condition()

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            with self.changed:
                self.pulled += 1
                self.changed.notify_all()
            yield i

    def wait_for(self, pulled: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.pulled >= pulled, timeout=10)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_depth_bounds_how_far_the_source_is_read_ahead(depth: int) -> None:
    source = Counting(20)
    it = iter(cpu(source, depth=depth))
    source.wait_for(depth)
    for consumed in range(1, 6):
        assert next(it) == consumed - 1
        source.wait_for(consumed + depth)
        # Give the producer the chance to overrun the bound before checking it.
        time.sleep(0.02)
        assert source.pulled == consumed + depth
    it.close()
    assert source.pulled == 5 + depth


def test_depth_must_be_positive() -> None:
    for depth in (0, -1, 1.5, True):
        with pytest.raises(ConfigError):
            cpu([], depth=depth)


# -- errors -----------------------------------------------------------------------------


def test_an_error_in_the_source_reaches_the_consumer_after_earlier_batches() -> None:
    source = Closed(list(range(10)), fail_at=3)
    it = iter(cpu(source))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="bad sample 3") as info:
        next(it)
    assert any("at batch 3" in note for note in info.value.__notes__)
    with pytest.raises(StopIteration):
        next(it)
    assert source.closed


def test_an_error_creating_the_source_iterator_reaches_the_consumer() -> None:
    class Broken:
        def __iter__(self) -> Iterator[int]:
            raise RuntimeError("cannot start")

    with pytest.raises(RuntimeError, match="cannot start"):
        list(cpu(Broken()))


def test_an_error_moving_a_batch_names_the_batch() -> None:
    class Unmovable(torch.Tensor):
        def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
            raise RuntimeError("no room")

    bad = torch.zeros(2).as_subclass(Unmovable)
    with pytest.raises(RuntimeError, match="no room") as info:
        list(cpu([torch.zeros(2), bad]))
    assert any("moving batch 1" in note for note in info.value.__notes__)


# -- shutdown ---------------------------------------------------------------------------


def test_break_stops_the_thread_and_closes_the_source() -> None:
    source = Closed(list(range(100)))
    for i in cpu(source):
        if i == 2:
            break
    assert source.closed
    assert source.pulled < 100


def test_close_stops_the_thread_and_closes_the_source() -> None:
    source = Closed(list(range(100)))
    it = iter(cpu(source))
    next(it)
    it.close()
    assert source.closed
    assert it.closed
    with pytest.raises(StopIteration):
        next(it)
    it.close()  # idempotent


def test_garbage_collection_stops_the_thread() -> None:
    source = Closed(list(range(100)))
    it = iter(cpu(source))
    next(it)
    del it
    gc.collect()
    assert source.closed


def test_prefetcher_close_and_context_manager_end_open_passes() -> None:
    source = Closed(list(range(100)))
    with cpu(source) as prefetcher:
        it = iter(prefetcher)
        next(it)
    assert source.closed and it.closed
    other = Closed(list(range(100)))
    prefetcher = cpu(other)
    with iter(prefetcher) as it2:
        assert isinstance(it2, PrefetchIterator)
        next(it2)
    assert other.closed


def test_an_exception_in_the_loop_body_ends_the_pass() -> None:
    source = Closed(list(range(100)))
    with pytest.raises(ZeroDivisionError), cpu(source) as prefetcher:
        for _ in prefetcher:
            raise ZeroDivisionError
    assert source.closed


def test_close_from_another_thread_wakes_a_blocked_consumer() -> None:
    gate = threading.Event()

    def source() -> Iterator[int]:
        yield 0
        gate.wait()
        yield 1

    it = iter(cpu(source()))
    assert next(it) == 0
    results: list[Any] = []

    def consume() -> None:
        results.append(list(it))

    consumer = threading.Thread(target=consume)
    consumer.start()
    closer = threading.Thread(target=it.close)
    closer.start()
    # close() waits for the producer, which is inside the source's next(): let it return.
    gate.set()
    closer.join(10)
    consumer.join(10)
    assert not closer.is_alive() and not consumer.is_alive()
    assert results == [[]] or results == [[1]]


def test_cpu_passes_hold_no_pinned_memory() -> None:
    prefetcher = cpu(image_batches(3))
    it = iter(prefetcher)
    next(it)
    assert it.pinned_bytes == 0 and prefetcher.pinned_bytes == 0
    it.close()


# -- device choice ----------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without CUDA")
def test_cuda_falls_back_to_cpu_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="concurrent_loader.gpu.prefetch"):
        prefetcher = CUDAPrefetcher(image_batches(2), device="cuda", mean=MEAN, std=STD)
        out = list(prefetcher)
    assert prefetcher.device == torch.device("cpu")
    assert all(b[0].device.type == "cpu" for b in out)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "CUDA is not available" in warnings[0].getMessage()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without CUDA")
def test_strict_refuses_to_fall_back() -> None:
    with pytest.raises(ConfigError, match="CUDA is not available"):
        CUDAPrefetcher([], device="cuda", strict=True)
