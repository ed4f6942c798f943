"""Marking batches that lost samples under ``on_error="skip"``.

A marked batch is the collated batch itself, of a subclass of its type
(:class:`PartialBatch` for tuples, :class:`PartialList`, :class:`PartialDict`) or, for a
tensor, the tensor with an attribute, carrying ``.skipped``: what was left out and why.
"""

from __future__ import annotations

from typing import Any

import torch

from ..pipeline import SkippedSample

__all__ = ["PartialBatch", "PartialDict", "PartialList", "is_partial", "mark", "pin"]


class PartialBatch(tuple[Any, ...]):
    """A tuple batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


class PartialList(list[Any]):
    """A list batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


class PartialDict(dict[Any, Any]):
    """A dict batch that lost samples under ``on_error="skip"``; see ``.skipped``."""

    skipped: list[SkippedSample]


_MARKED: dict[type, type] = {tuple: PartialBatch, list: PartialList, dict: PartialDict}


def mark(batch: Any, skipped: list[SkippedSample]) -> Any:
    for kind, marked_kind in _MARKED.items():
        if isinstance(batch, kind):
            marked = marked_kind(batch)
            marked.skipped = skipped
            return marked
    if isinstance(batch, torch.Tensor):
        batch.skipped = skipped  # type: ignore[attr-defined]
        return batch
    raise TypeError(
        f"on_error='skip' needs batches that can be marked (tuple, list, dict or tensor), "
        f"got {type(batch).__name__}"
    )


def pin(batch: Any) -> Any:
    """``batch`` with its tensors in pinned memory (torch's pin thread passes ours through)."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, (tuple, list)):
        return type(batch)(pin(item) for item in batch)
    if isinstance(batch, dict):
        return {key: pin(value) for key, value in batch.items()}
    return batch


def is_partial(batch: Any) -> bool:
    """True if ``batch`` lost samples under ``on_error="skip"`` (its ``.skipped`` says which)."""
    return bool(getattr(batch, "skipped", None))
