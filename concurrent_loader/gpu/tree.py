"""Walking the nested containers (tuples, named or not, lists, mappings) a batch is made of.

A leaf's path is the tuple of positions and keys leading to it (``()`` for a bare leaf);
leaves are visited depth first in container order; anything else is a leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

__all__ = ["Path", "first_tensor", "map_batch"]

Path = tuple[Hashable, ...]


def map_batch(node: Any, fn: Callable[[Path, Any], Any], path: Path = ()) -> Any:
    """The same structure as ``node`` (a batch, at ``path`` in it) with every leaf replaced by
    ``fn(path, leaf)``."""
    if isinstance(node, torch.Tensor):
        return fn(path, node)
    if isinstance(node, tuple):
        items = [map_batch(item, fn, (*path, i)) for i, item in enumerate(node)]
        if hasattr(node, "_fields"):  # a named tuple takes its fields as arguments
            return type(node)(*items)
        return tuple(items) if type(node) is tuple else _rebuild(node, items, tuple)
    if isinstance(node, list):
        items = [map_batch(item, fn, (*path, i)) for i, item in enumerate(node)]
        return items if type(node) is list else _rebuild(node, items, list)
    if isinstance(node, Mapping):
        mapped = {key: map_batch(value, fn, (*path, key)) for key, value in node.items()}
        return mapped if type(node) is dict else _rebuild(node, mapped, dict)
    return fn(path, node)


def _rebuild(node: Any, contents: Any, fallback: Callable[[Any], Any]) -> Any:
    # A subclass whose constructor takes other arguments: the data matters more than the type.
    try:
        return type(node)(contents)
    except TypeError:
        return fallback(contents)


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor leaf in visiting order, or None."""
    if isinstance(batch, torch.Tensor):
        return batch
    if not isinstance(batch, (tuple, list, Mapping)):
        return None
    items = batch.values() if isinstance(batch, Mapping) else batch
    return next((t for t in map(first_tensor, items) if t is not None), None)
