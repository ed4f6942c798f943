"""Exact resume: a loader's place in its epochs, and its restoring.

The place is small: the epoch number, the random state the epoch's draws started from (the
loader's ``generator``, a sampler's, or torch's global RNG), whether the epoch drew the
workers' base seed first, and how many batches the consumer received. Restored, the same
plan is redrawn and what was received skipped: the same batches in the same order, whatever
``num_workers`` and GET order. Plain values and tensors, in torchdata's protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from ..streaming.sampler import world

__all__ = ["STATE_VERSION", "EpochProgress", "GeneratorStates", "world"]

STATE_VERSION = 1


@dataclass
class EpochProgress:
    epoch: int
    generator_states: dict[str, torch.Tensor]
    num_batches: int
    batches_taken: int
    samples: int
    base_seed_drawn: bool = False
    done: bool = False


class GeneratorStates:
    """The random generators an epoch's order is drawn from: the loader's own ``generator``
    (torch's global RNG when it has none and ``use_global``) and a ``generator`` attribute of
    the user's sampler or batch sampler (or of the sampler a batch sampler wraps)."""

    def __init__(self, loader: torch.Generator | None, *samplers: object) -> None:
        self.loader = loader
        self.samplers = samplers
        self.use_global = False  # set per epoch, from the sampler it draws from

    def _generators(self) -> dict[str, torch.Generator]:
        found: dict[str, torch.Generator] = {}
        if self.loader is not None:
            found["loader"] = self.loader
        elif self.use_global:
            found["global"] = torch.default_generator
        names = ("sampler", "batch_sampler")
        for name, sampler in zip(names, self.samplers, strict=False):
            inner = getattr(sampler, "sampler", None)
            for key, owner in ((name, sampler), (f"{name}.sampler", inner)):
                generator = getattr(owner, "generator", None)
                if isinstance(generator, torch.Generator) and all(
                    generator is not g for g in found.values()
                ):
                    found[key] = generator
        return found

    def get(self) -> dict[str, torch.Tensor]:
        return {key: generator.get_state() for key, generator in self._generators().items()}

    def set(self, states: dict[str, torch.Tensor]) -> None:
        for key, generator in self._generators().items():
            if key in states:
                generator.set_state(states[key])


def make_state(
    progress: EpochProgress | None,
    next_epoch: int,
    generators: GeneratorStates,
    *,
    next_draws_base_seed: bool = False,
) -> dict[str, Any]:
    """Mid-epoch: resume at the next batch not received; between epochs: the next epoch
    (``next_draws_base_seed``: whether it will draw the workers' base seed first)."""
    rank, world_size = world()
    if progress is None or progress.done:
        epoch, taken, states = next_epoch, 0, generators.get()
        base_seed_drawn = next_draws_base_seed
    else:
        epoch, taken, states = progress.epoch, progress.batches_taken, progress.generator_states
        base_seed_drawn = progress.base_seed_drawn
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batches_taken": taken,
        "generator_states": states,
        "base_seed_drawn": base_seed_drawn,
        "rank": rank,
        "world_size": world_size,
    }


def check_version(state: dict[str, Any]) -> None:
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"unknown loader state version {state.get('version')!r}")


def restore(state: dict[str, Any], generators: GeneratorStates) -> tuple[int, int]:
    """Set the generators from ``state``; return (epoch, batches already taken). Whether the
    epoch drew a base seed first is ``state.get("base_seed_drawn", False)``."""
    rank, world_size = world()
    # Another rank's state is taken: under DDP the ranks advance in lockstep, and frameworks
    # (Lightning) save rank 0's loader state for every rank. Each rank still draws its own
    # shard.
    if state["world_size"] != world_size:
        raise ConfigError(
            f"the state was saved by rank {state['rank']} of {state['world_size']}, but this "
            f"is rank {rank} of {world_size}: resuming with a different world size is not "
            "supported"
        )
    generators.set(state["generator_states"])
    return int(state["epoch"]), int(state["batches_taken"])
