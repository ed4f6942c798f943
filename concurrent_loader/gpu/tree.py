"""Walking the nested containers a batch is made of.

:func:`map_batch` rebuilds a batch (any nesting of tuples, named or not, lists and
mappings) with the same container types, each leaf replaced by ``fn(path, leaf)``. A
leaf's path is the tuple of positions and keys leading to it (``()`` for a bare leaf);
leaves are visited depth first in container order; ``str``, ``bytes`` and objects of any
other type are leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["Path", "first_tensor", "iter_leaves", "map_batch"]

Path = tuple[Hashable, ...]


def map_batch(batch: Any, fn: Callable[[Path, Any], Any]) -> Any:
    """The same structure as ``batch`` with every leaf replaced by ``fn(path, leaf)``."""
    return _map(batch, (), fn)


def _map(node: Any, path: Path, fn: Callable[[Path, Any], Any]) -> Any:
    if isinstance(node, torch.Tensor):
        return fn(path, node)
    if isinstance(node, tuple):
        items = [_map(item, (*path, i), fn) for i, item in enumerate(node)]
        if hasattr(node, "_fields"):  # a named tuple takes its fields as arguments
            return type(node)(*items)
        return tuple(items) if type(node) is tuple else _rebuild(node, items, tuple)
    if isinstance(node, list):
        items = [_map(item, (*path, i), fn) for i, item in enumerate(node)]
        return items if type(node) is list else _rebuild(node, items, list)
    if isinstance(node, Mapping):
        mapped = {key: _map(value, (*path, key), fn) for key, value in node.items()}
        return mapped if type(node) is dict else _rebuild(node, mapped, dict)
    return fn(path, node)


def _rebuild(node: Any, contents: Any, fallback: Callable[[Any], Any]) -> Any:
    # A subclass whose constructor takes other arguments cannot be rebuilt from its
    # contents; the plain container keeps the data, which matters more than the type.
    try:
        return type(node)(contents)
    except TypeError:
        return fallback(contents)


def iter_leaves(batch: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """``(path, leaf)`` for every leaf of ``batch``, in the order :func:`map_batch` visits."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, (tuple, list)):
        for i, item in enumerate(batch):
            yield from iter_leaves(item, (*path, i))
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            yield from iter_leaves(value, (*path, key))
    else:
        yield path, batch


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor leaf of ``batch`` in visiting order, or ``None`` if it has none."""
    return next((leaf for _, leaf in iter_leaves(batch) if isinstance(leaf, torch.Tensor)), None)
