"""Walking the nested containers (tuples, named or not, lists, mappings) a batch is made of.

A leaf's path is the tuple of positions and keys leading to it (``()`` for a bare leaf);
leaves are visited depth first in container order; anything else is a leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

__all__ = ["Path", "first_tensor", "map_batch", "rebuild"]

Path = tuple[Hashable, ...]


def map_batch(node: Any, fn: Callable[[Path, Any], Any], path: Path = ()) -> Any:
    """The same structure as ``node`` (a batch, at ``path`` in it) with every leaf replaced by
    ``fn(path, leaf)``."""
    if isinstance(node, torch.Tensor):
        return fn(path, node)
    if isinstance(node, (tuple, list)):
        return rebuild(node, [map_batch(item, fn, (*path, i)) for i, item in enumerate(node)])
    if isinstance(node, Mapping):
        return rebuild(node, {key: map_batch(v, fn, (*path, key)) for key, v in node.items()})
    return fn(path, node)


def rebuild(node: Any, contents: list[Any] | dict[Any, Any]) -> Any:
    """``contents`` in ``node``'s container type, with ``node``'s attributes (a partial
    batch's ``skipped``); in a plain one when that type's constructor takes other arguments
    (the data matters more than the type)."""
    if hasattr(node, "_fields"):  # a named tuple takes its fields as arguments
        return type(node)(*contents)
    try:
        out = type(node)(contents)
    except TypeError:
        plain = dict if isinstance(node, Mapping) else list if isinstance(node, list) else tuple
        return plain(contents)
    if hasattr(node, "__dict__"):
        out.__dict__.update(vars(node))
    return out


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor leaf in visiting order, or None."""
    if isinstance(batch, torch.Tensor):
        return batch
    if not isinstance(batch, (tuple, list, Mapping)):
        return None
    items = batch.values() if isinstance(batch, Mapping) else batch
    return next((t for t in map(first_tensor, items) if t is not None), None)
