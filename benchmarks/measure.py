"""One measured run, in a fresh subprocess: ``python -m benchmarks.measure SPEC OUT``.

Each run gets its own process so that no configuration inherits another's imports,
thread pools, connections or heap, and so that CPU time and peak RSS belong to it alone.
The process pins itself to the client CPUs before importing torch or starting workers;
workers inherit the pinning.

What a loader run measures, all as seen by the consumer:

* ``startup_s``: dataset construction (including any listing) to first batch in hand;
  ``first_batch_s``: ``iter(loader)`` to first batch.
* A warm-up, then a window of ``run_images`` images (fewer when the epoch ends first):
  ``images_per_s`` over the window and the time each ``next()`` blocked
  (``batch_wait_ms`` percentiles). The warm-up is ``warmup_batches`` batches, or more
  when the loader buffers more: every batch a loader can hold ready ahead of the consumer
  (torch's ``prefetch_factor`` per worker, plus ``prefetch_batches`` per process for
  ours) is drained first, plus one. Otherwise the window would be credited with work done
  while the first batch was awaited, and a deeper buffer would look like a faster loader.
* ``cpu_s``: user+system CPU of this process and all its descendants over the window.
  Live descendants are read from ``/proc``; descendants already reaped are in
  ``RUSAGE_CHILDREN``. The window closes when the last counted batch arrives, before the
  loader is exhausted, so no worker exits inside it and nothing is counted twice.
* ``peak_rss_mb``: the sum of every loader process's peak resident set (``VmHWM``),
  read at the end of the window; shared pages are counted once per process, as ``ps``
  counts them.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any


def pin_to(cpus: list[int]) -> list[int]:
    """Restrict this process (and so its future children and threads) to ``cpus``."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cpus))
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def process_tree_usage() -> tuple[float, int]:
    """(user+system CPU seconds, minor page faults) of this process, its live descendants
    and its reaped children, read in one pass over the tree."""
    import psutil

    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    cpu = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    faults = own.ru_minflt + reaped.ru_minflt
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            child_faults = _proc_minor_faults(child.pid)
        except (psutil.NoSuchProcess, OSError, IndexError, ValueError):
            continue  # ended meanwhile: counted once reaped
        # children_* holds that child's own reaped children (e.g. a worker's helpers).
        cpu += t.user + t.system + t.children_user + t.children_system
        faults += child_faults
    return cpu, faults


def process_tree_cpu_seconds() -> float:
    """User+system CPU of this process, its live descendants and its reaped children."""
    return process_tree_usage()[0]


def own_usage() -> tuple[float, int]:
    """(user+system CPU seconds, minor page faults) of this process alone, all its threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_minflt


def _proc_minor_faults(pid: int) -> int:
    """A live process's minor faults plus those of its reaped children (``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces: count fields after its closing ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]) + int(fields[8])  # minflt, cminflt (fields 10 and 11)


def page_fault_us(mib: int = 64) -> float:
    """Microseconds of CPU per minor fault on this machine: the CPU time of touching one
    byte in each page of ``mib`` MiB of fresh anonymous memory, per fault it took."""
    import mmap

    memory = mmap.mmap(-1, mib << 20)
    try:
        cpu, faults = own_usage()
        for offset in range(0, mib << 20, mmap.PAGESIZE):
            memory[offset] = 1
        cpu_after, faults_after = own_usage()
    finally:
        memory.close()
    return (cpu_after - cpu) * 1e6 / max(1, faults_after - faults)


def _peak_rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def process_tree_peak_rss_bytes() -> tuple[int, int]:
    """(sum of peak RSS over this process and its live descendants, number of processes)."""
    import psutil

    pids = [os.getpid()] + [c.pid for c in psutil.Process().children(recursive=True)]
    peaks = [_peak_rss_bytes(pid) for pid in pids]
    if not any(peaks):
        # No /proc: fall back to this process's own peak (ru_maxrss is KiB on Linux).
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, 1
    return sum(peaks), len(pids)


def descendant_affinities() -> list[list[int]]:
    import psutil

    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            out.append(sorted(child.cpu_affinity()))
        except (psutil.NoSuchProcess, AttributeError):
            continue
    return out


def percentiles(values: list[float], qs: tuple[float, ...] = (50, 95, 99)) -> dict[str, float]:
    import numpy as np

    if not values:
        return {f"p{q:g}": float("nan") for q in qs} | {"mean": float("nan"), "max": float("nan")}
    arr = np.asarray(values, dtype=np.float64)
    out = {f"p{q:g}": float(np.percentile(arr, q)) for q in qs}
    out["mean"] = float(arr.mean())
    out["max"] = float(arr.max())
    return out


def _check_batch(batch: Any, image_size: int) -> int:
    images, labels = batch
    if images.dtype.is_floating_point or tuple(images.shape[1:]) != (3, image_size, image_size):
        raise RuntimeError(
            f"batch images must be uint8 [B, 3, {image_size}, {image_size}], "
            f"got {images.dtype} {tuple(images.shape)}"
        )
    if labels.shape[0] != images.shape[0]:
        raise RuntimeError(f"{labels.shape[0]} labels for {images.shape[0]} images")
    return int(images.shape[0])


def buffered_batches(loader: Any) -> int:
    """Batches ``loader`` may hold finished or in progress ahead of its consumer."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    per_worker = int(getattr(loader, "prefetch_factor", None) or 0) if workers else 0
    tuning = getattr(loader, "tuning", None)  # ours: prefetch_batches=None is what it starts at
    per_process = int((tuning or {}).get("prefetch_batches") or 0)
    return per_worker * workers + per_process * max(1, workers)


def run_loader(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.configs import BUILDERS, LoaderParams

    params = LoaderParams(**spec["params"])
    run_images: int = spec["run_images"]

    t_build = time.perf_counter()
    loader, closer = BUILDERS[params.config](params)
    with closer:
        warmup_batches = max(spec["warmup_batches"], buffered_batches(loader) + 1)
        epoch = len(loader)  # batches
        if warmup_batches >= epoch:
            raise RuntimeError(
                f"the epoch has {epoch} batches, {warmup_batches} are needed to warm up "
                f"{params.config}: use more --images"
            )
        # The window never crosses an epoch boundary (that would time worker restarts).
        run_images = min(run_images, (epoch - warmup_batches) * params.batch_size)
        t_iter = time.perf_counter()
        it = iter(loader)
        seen = _check_batch(next(it), params.image_size)
        t_first = time.perf_counter()
        for _ in range(warmup_batches - 1):
            seen += _check_batch(next(it), params.image_size)

        waits: list[float] = []
        images = 0
        cpu_start = process_tree_cpu_seconds()
        t_start = time.perf_counter()
        batches_left = epoch - warmup_batches
        while images < run_images and batches_left > 0:
            batches_left -= 1
            t0 = time.perf_counter()
            batch = next(it)
            waits.append(time.perf_counter() - t0)
            images += _check_batch(batch, params.image_size)
        t_end = time.perf_counter()
        cpu_end = process_tree_cpu_seconds()
        peak_rss, processes = process_tree_peak_rss_bytes()
        worker_affinity = descendant_affinities()
        del it

    seconds = t_end - t_start
    cpu = cpu_end - cpu_start
    return {
        "images": images,
        "warmup_batches": warmup_batches,
        "warmup_images": seen,
        "batches": len(waits),
        "seconds": seconds,
        "images_per_s": images / seconds,
        "batch_wait_ms": {k: v * 1000 for k, v in percentiles(waits).items()},
        "first_batch_s": t_first - t_iter,
        "startup_s": t_first - t_build,
        "cpu_s": cpu,
        "cpu_s_per_1000_images": cpu / images * 1000,
        "peak_rss_mb": peak_rss / 2**20,
        "processes": processes,
        "worker_affinity": worker_affinity,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m benchmarks.measure SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    # Pin before anything starts a thread (torch, obstore's runtime, worker processes).
    affinity = pin_to(spec.get("client_cpus", []))
    if spec["kind"] == "loader":
        result = run_loader(spec)
    elif spec["kind"] == "fetch":
        from benchmarks.fetch_only import run_fetch

        result = run_fetch(spec)
    else:
        raise ValueError(f"unknown run kind {spec['kind']!r}")
    result["affinity"] = affinity
    Path(args[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
