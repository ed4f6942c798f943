"""Exact resume: what a loader records of its place in the epochs, and how it restores it.

The epoch's plan is drawn in the main process from the sampler, so the place is small: the
epoch number, the random state the sampler drew the epoch's order from, and how many
batches the consumer received. A loader built with the same arguments redraws the same
plan from that state and skips what was received: the same batches, in the same order,
whatever ``num_workers`` is and whatever order GETs complete in. The state is plain values
and tensors (``torch.save`` takes it), in torchdata's ``StatefulDataLoader`` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..errors import ConfigError, Reason

__all__ = ["STATE_VERSION", "EpochProgress", "GeneratorStates", "world"]

STATE_VERSION = 1


@dataclass
class EpochProgress:
    """The epoch being iterated: what a ``state_dict`` taken now records."""

    epoch: int
    generator_states: dict[str, torch.Tensor]
    num_batches: int
    batches_taken: int
    samples: int
    done: bool = False


class GeneratorStates:
    """The random generators an epoch's order is drawn from: the loader's own ``generator``
    and a ``generator`` attribute of the user's sampler."""

    def __init__(self, loader: torch.Generator | None, sampler: object) -> None:
        self.loader = loader
        self.sampler = sampler

    def get(self) -> dict[str, torch.Tensor]:
        states = {}
        if self.loader is not None:
            states["loader"] = self.loader.get_state()
        sampler_generator = getattr(self.sampler, "generator", None)
        if isinstance(sampler_generator, torch.Generator):
            states["sampler"] = sampler_generator.get_state()
        return states

    def set(self, states: dict[str, torch.Tensor]) -> None:
        if "loader" in states and self.loader is not None:
            self.loader.set_state(states["loader"])
        sampler_generator = getattr(self.sampler, "generator", None)
        if "sampler" in states and isinstance(sampler_generator, torch.Generator):
            sampler_generator.set_state(states["sampler"])


def world() -> tuple[int, int]:
    """(rank, world size) under torch.distributed, else (0, 1); read when called."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def make_state(
    progress: EpochProgress | None, next_epoch: int, generators: GeneratorStates
) -> dict[str, Any]:
    """Mid-epoch: resume at the next batch not received; between epochs: the next epoch."""
    rank, world_size = world()
    if progress is None or progress.done:
        epoch, taken, states = next_epoch, 0, generators.get()
    else:
        epoch, taken, states = progress.epoch, progress.batches_taken, progress.generator_states
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches_taken": taken,
        "generator_states": states,
        "rank": rank,
        "world_size": world_size,
    }


def check_version(state: dict[str, Any]) -> None:
    if state.get("version") != STATE_VERSION:
        raise ConfigError(
            f"unknown loader state version {state.get('version')!r}",
            cause=Reason.INVALID_ARGUMENT,
        )


def restore(state: dict[str, Any], generators: GeneratorStates) -> tuple[int, int]:
    """Set the generators from ``state``; return (epoch, batches already taken)."""
    rank, world_size = world()
    if (state["rank"], state["world_size"]) != (rank, world_size):
        raise ConfigError(
            f"the state was saved by rank {state['rank']} of {state['world_size']}, but this "
            f"is rank {rank} of {world_size}: resuming with a different world size (or rank) "
            "is not supported",
            cause=Reason.INVALID_ARGUMENT,
        )
    generators.set(state["generator_states"])
    return int(state["epoch"]), int(state["batches_taken"])
