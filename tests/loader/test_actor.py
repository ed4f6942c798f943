"""How a Ray actor's batch crosses the object store: tensors as numpy arrays, pickled out of
band (no copy into the pickle), each copied once on the trainer into a tensor it owns."""

from __future__ import annotations

import pickle

import torch

from concurrent_loader.loader.actor import Shipped, ship, unship
from concurrent_loader.pipeline import Failure, Partial


def crossed(outcome):
    """``outcome`` pickled as Ray pickles (protocol 5, buffers out of band), read back with
    read-only buffers, as Ray's object store hands them out."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(ship(outcome), protocol=5, buffer_callback=buffers.append)
    frozen = [memoryview(bytes(b.raw())) for b in buffers]  # read-only, as plasma's
    return unship(pickle.loads(data, buffers=frozen)), buffers


def test_a_batchs_tensors_cross_out_of_band_and_come_back_equal_writable_and_owned():
    images = torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(4)
    batch = {"image": images, "label": labels, "name": ["a", "b", "c", "d"]}
    back, buffers = crossed(batch)
    assert len(buffers) == 2  # both tensors' bytes travelled outside the pickle
    assert torch.equal(back["image"], images) and back["image"].dtype == torch.uint8
    assert torch.equal(back["label"], labels) and back["label"].dtype == torch.int64
    assert back["name"] == ["a", "b", "c", "d"]
    back["image"].add_(1)  # writable: a copy of its own
    assert not torch.equal(back["image"], images)


def test_a_dtype_numpy_lacks_travels_as_a_tensor():
    half = torch.ones(2, 2, dtype=torch.bfloat16)
    shipped = ship((half,))
    assert isinstance(shipped[0], torch.Tensor)
    (back,), _ = crossed((half,))
    assert torch.equal(back, half) and back.dtype == torch.bfloat16


def test_partial_batches_keep_their_skipped_and_failures_pass_as_they_are():
    partial = Partial((torch.zeros(2, 3), torch.tensor([1, 2])), skipped=[])
    shipped = ship(partial)
    assert isinstance(shipped, Partial) and isinstance(shipped.batch[0], Shipped)
    back, _ = crossed(partial)
    assert isinstance(back, Partial) and back.skipped == []
    assert torch.equal(back.batch[1], torch.tensor([1, 2]))
    failure = Failure(ValueError("s3://bucket/key: bad"))
    assert ship(failure) is failure and unship(failure) is failure


class Marked(torch.Tensor):
    """A tensor subclass (as torchvision's ``tv_tensors`` are)."""


def test_views_subclasses_and_expanded_tensors_travel_as_tensors():
    base = torch.arange(12).reshape(3, 4)
    marked = base.clone().as_subclass(Marked)
    leaves = (base.t(), base[1:], base[0].expand(5, 4), marked)
    shipped = ship(leaves)
    assert all(isinstance(leaf, torch.Tensor) for leaf in shipped)
    back, _ = crossed(leaves)
    assert all(torch.equal(b, a) for a, b in zip(leaves, back, strict=True))
    assert type(back[3]) is Marked
    assert back[0].stride() == base.t().stride()
