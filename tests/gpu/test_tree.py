from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import pytest
import torch

from concurrent_loader import PartialBatch, PartialDict, PartialList
from concurrent_loader.gpu.tree import Path, first_tensor, map_batch

Pair = namedtuple("Pair", ["image", "label"])


def _record(batch: Any) -> tuple[Any, list[tuple[Path, Any]]]:
    seen: list[tuple[Path, Any]] = []

    def fn(path: Path, leaf: Any) -> Any:
        seen.append((path, leaf))
        return leaf

    return map_batch(batch, fn), seen


def test_bare_tensor_is_a_leaf_with_empty_path() -> None:
    t = torch.zeros(2)
    out, seen = _record(t)
    assert out is t
    assert seen == [((), t)]


def test_structure_and_container_types_are_kept() -> None:
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    batch = (
        {"image": a, "meta": {"name": "x.jpg", "ids": [b, 3]}},
        [c, b"raw"],
        Pair(a, 7),
        OrderedDict(z=c),
    )
    out, seen = _record(batch)
    assert type(out) is tuple
    assert type(out[0]) is dict and out[0]["meta"]["name"] == "x.jpg"
    assert type(out[1]) is list and out[1][1] == b"raw"
    assert type(out[2]) is Pair and out[2].label == 7
    assert type(out[3]) is OrderedDict
    paths = [path for path, _ in seen]
    assert paths == [
        (0, "image"),
        (0, "meta", "name"),
        (0, "meta", "ids", 0),
        (0, "meta", "ids", 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
        (3, "z"),
    ]


def test_strings_are_leaves_not_sequences() -> None:
    out, seen = _record(["abc", "de"])
    assert out == ["abc", "de"]
    assert seen == [((0,), "abc"), ((1,), "de")]


def test_leaves_are_replaced() -> None:
    batch = {"x": torch.ones(2), "y": [torch.zeros(1), "s"]}
    out = map_batch(batch, lambda path, leaf: leaf * 2 if isinstance(leaf, torch.Tensor) else leaf)
    assert torch.equal(out["x"], torch.full((2,), 2.0))
    assert out["y"][1] == "s"


def test_unrebuildable_subclass_falls_back_to_plain_container() -> None:
    class Strict(dict):  # type: ignore[type-arg]
        def __init__(self, *, required: int) -> None:
            super().__init__()

    batch = Strict(required=1)
    batch["a"] = torch.zeros(1)
    out = map_batch(batch, lambda path, leaf: leaf)
    assert type(out) is dict and set(out) == {"a"}


def test_first_tensor() -> None:
    t = torch.zeros(3)
    assert first_tensor(("a", {"k": t})) is t
    assert first_tensor(["a", 1]) is None
    assert first_tensor([[], {"a": "b", "c": (1, t)}]) is t


@pytest.mark.parametrize("kind", [PartialBatch, PartialList])
def test_a_partial_batch_keeps_its_type_and_marks(kind: type) -> None:
    batch = kind([torch.ones(2), "label"])
    batch.skipped = ["sample 3"]
    out = map_batch(batch, lambda path, leaf: leaf * 2 if isinstance(leaf, torch.Tensor) else leaf)
    assert type(out) is kind and out.skipped == ["sample 3"] and out[1] == "label"
    assert torch.equal(out[0], torch.full((2,), 2.0))


def test_a_partial_dict_keeps_its_type_and_marks() -> None:
    batch = PartialDict(image=torch.ones(1))
    batch.skipped = ["sample 3"]
    out = map_batch(batch, lambda path, leaf: leaf)
    assert type(out) is PartialDict and out.skipped == ["sample 3"] and set(out) == {"image"}
