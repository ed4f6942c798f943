"""Remote data preparation (DPP's claim): a trainer whose core is busy with its own step runs
at its synthetic rate only if decoding happens elsewhere.

On a machine with two cores, the trainer process is pinned to the first and runs a training
step of fixed compute (``--step-matmuls`` float32 matmuls of 256x256, one thread) per batch
of JPEGs from local disk (``ImageFolder``, decoded and resized to 224 px). Three runs:

- ``synthetic``: the step alone, on a batch made once (the ceiling);
- ``local``: fed by one persistent local worker process, which shares the trainer's core;
- ``ray``: fed by one Ray actor (``RayExecutor``) pinned to the second core.

Reported: steps per second of each, and their ratio to ``synthetic`` (goal: ray >= 0.9x,
clearly above local). Then the per-batch cost of each hand-off alone (no step, no decode: a
dataset of ready uint8 tensors): ms per batch and MB/s through Ray's object store against
the local worker's shared-memory hand-off.

Ray runs only in a loopback-only network namespace: started outside one, the script runs
itself again inside ``unshare -rn`` (a user and network namespace with only ``lo``)::

    flock /tmp/bench.lock python -m benchmarks.remote_prep
    python -m benchmarks.remote_prep --smoke --json   # seconds; what CI runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

_REPO_ROOT = Path(__file__).resolve().parent.parent
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

INSIDE = "CONCURRENT_LOADER_LOOPBACK_NAMESPACE"
ENTER = 'ip link set lo up && exec "$0" "$@"'


def enter_loopback_namespace(argv: list[str]) -> None:
    """Run this script again inside a loopback-only network namespace (never returns)."""
    if shutil.which("unshare") is None:
        sys.exit("remote_prep: needs `unshare` (util-linux) to start Ray on loopback only")
    os.environ.update({INSIDE: "1", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(_REPO_ROOT)})
    command = [sys.executable, "-m", "benchmarks.remote_prep", *argv]
    os.execvp("unshare", ["unshare", "-rn", "sh", "-c", ENTER, *command])


class Step:
    """A training step of fixed compute: ``matmuls`` products of 256x256 float32 matrices,
    plus a reduction over the batch so the batch is read."""

    def __init__(self, matmuls: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.matmuls = matmuls
        self.a = torch.rand(256, 256, generator=generator)
        # Orthogonal: the product keeps its scale, so no step ever runs on denormal floats
        # (a shrinking product made later matmuls about 10x slower, and the step's cost
        # depend on how many there were).
        self.b = torch.linalg.qr(torch.randn(256, 256, generator=generator))[0]

    def __call__(self, batch: Any) -> float:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        out = self.a
        for _ in range(self.matmuls):
            out = out @ self.b
        return float(out[0, 0]) + float(images.float().mean())


class ReadyTensors(Dataset[torch.Tensor]):
    """``size`` samples, each the same ready uint8 image tensor: what a hand-off costs alone."""

    def __init__(self, size: int, image_size: int) -> None:
        self.size = size
        self.image = torch.full((3, image_size, image_size), 7, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.image


class PinTo:
    """``worker_init_fn`` that pins the worker (or actor) process to ``cpus``."""

    def __init__(self, cpus: set[int]) -> None:
        self.cpus = cpus

    def __call__(self, worker: int) -> None:
        os.sched_setaffinity(0, self.cpus)
        torch.set_num_threads(1)


def steps_per_s(batches: Iterator[Any], step: Callable[[Any], float], count: int) -> float:
    """The rate of ``count`` steps, each on the next batch (after one warm-up batch)."""
    step(next(batches))
    started = time.perf_counter()
    for _ in range(count):
        step(next(batches))
    return count / (time.perf_counter() - started)


def endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def handoff(loader: Any, batches: int) -> dict[str, float]:
    """ms per batch and MB/s of batches that cost nothing to make (after a warm-up epoch)."""
    for _ in loader:
        pass
    times: list[float] = []
    size = 0
    source = endless(loader)
    asked = time.perf_counter()
    for _ in range(batches):
        batch = next(source)
        got = time.perf_counter()
        times.append(got - asked)
        size = batch.numel() * batch.element_size()
        asked = got
    mean = statistics.fmean(times)
    return {"ms_per_batch": 1000 * mean, "mb_per_s": size / mean / 1e6, "batch_mb": size / 1e6}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from benchmarks.data import DatasetSpec, ensure_local
    from concurrent_loader import ConcurrentDataLoader, ImageFolder
    from concurrent_loader.loader.ray_workers import RayExecutor

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit(f"remote_prep: needs two CPUs, this process may use {cpus}")
    trainer_cpu, actor_cpus = cpus[0], set(cpus[1:2])
    local, _ = ensure_local(DatasetSpec(images=args.images), args.data_dir)
    # Ray's own processes start before the trainer is pinned, so they may use both cores.
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    os.sched_setaffinity(0, {trainer_cpu})
    torch.set_num_threads(1)
    step = Step(args.step_matmuls)
    dataset = ImageFolder(str(local.train_dir), image_size=args.image_size)
    common: dict[str, Any] = {"batch_size": args.batch_size, "shuffle": True}
    common |= {"decode_threads": 1, "prefetch_batches": 2}

    results: dict[str, Any] = {"trainer_cpu": trainer_cpu, "actor_cpus": sorted(actor_cpus)}
    synthetic = default_collate([dataset[i] for i in range(args.batch_size)])
    results["synthetic_steps_per_s"] = steps_per_s(iter(lambda: synthetic, None), step, args.steps)
    workers = ConcurrentDataLoader(dataset, num_workers=1, persistent_workers=True, **common)
    results["local_steps_per_s"] = steps_per_s(endless(workers), step, args.steps)
    del workers
    actors = ConcurrentDataLoader(
        dataset,
        worker_init_fn=PinTo(actor_cpus),
        executor=RayExecutor(actors=1, cpus_per_actor=1),
        **common,
    )
    results["ray_steps_per_s"] = steps_per_s(endless(actors), step, args.steps)
    actors.close()
    for name in ("local", "ray"):
        results[f"{name}_vs_synthetic"] = (
            results[f"{name}_steps_per_s"] / results["synthetic_steps_per_s"]
        )

    ready = ReadyTensors(args.batch_size * 8, args.image_size)
    plain = {"batch_size": args.batch_size, "prefetch_batches": 2}
    workers = ConcurrentDataLoader(ready, num_workers=1, persistent_workers=True, **plain)
    results["handoff_local"] = handoff(workers, args.handoff_batches)
    del workers
    actors = ConcurrentDataLoader(
        ready, worker_init_fn=PinTo(actor_cpus), executor=RayExecutor(actors=1), **plain
    )
    results["handoff_ray"] = handoff(actors, args.handoff_batches)
    actors.close()
    ray.shutdown()
    return results


def table(results: dict[str, Any]) -> str:
    rows = [
        f"trainer on CPU {results['trainer_cpu']}, actor on CPUs {results['actor_cpus']}",
        f"{'feed':<10} {'steps/s':>9} {'x synthetic':>12}",
        f"{'synthetic':<10} {results['synthetic_steps_per_s']:>9.2f} {1.0:>12.2f}",
    ]
    for name in ("local", "ray"):
        rate, ratio = results[f"{name}_steps_per_s"], results[f"{name}_vs_synthetic"]
        rows.append(f"{name:<10} {rate:>9.2f} {ratio:>12.2f}")
    rows.append(f"{'hand-off':<10} {'ms/batch':>9} {'MB/s':>9} {'MB/batch':>9}")
    for name in ("local", "ray"):
        cost = results[f"handoff_{name}"]
        rows.append(
            f"{name:<10} {cost['ms_per_batch']:>9.2f} {cost['mb_per_s']:>9.0f}"
            f" {cost['batch_mb']:>9.2f}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="generated JPEGs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=32, help="timed steps per feed")
    parser.add_argument("--step-matmuls", type=int, default=600, help="compute per step")
    parser.add_argument("--handoff-batches", type=int, default=64)
    parser.add_argument("--data-dir", type=Path, default=_REPO_ROOT / ".bench/data")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, for CI")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.images, args.batch_size, args.steps = 32, 4, 4
        args.step_matmuls, args.handoff_batches, args.image_size = 2, 4, 64
    if os.environ.get(INSIDE) != "1":
        enter_loopback_namespace(argv)
    results = run(args)
    print(json.dumps(results) if args.json else table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
