"""Keys at scale: how fast a dataset of N keys is ready from its manifest, and what its key
table costs the main process and each worker.

Keys are shaped like ImageNet's (``train/n01440764/n01440764_10026.JPEG``, 1000 classes,
sorted as a listing gives them). For each count and each manifest form (the text form; the
binary form too where the library writes one), a fresh process makes
``ObjectDataset.from_manifest`` and reports:

- ``ready_s``: the time ``from_manifest`` takes;
- ``main_growth_x``: the main process's RSS growth over the keys' raw UTF-8 bytes;
- ``worker_mib[method]``: per start method (``fork``, ``spawn``, ``forkserver``), the unique
  set size (psutil ``memory_full_info().uss``) of a worker that received the dataset and read
  every sample's key (``ds.source.reads(i)`` for every index: what ``ds[i]`` reads before
  its GET, no network), above that of an empty worker of the same method.

Goals: ready < 5 s at 10 M keys; growth <= 1.5x the raw key bytes; each worker <= 20 MiB above
an empty one. The script uses only what the library had before its key table was shared, so
the same script measures both.

    python -m benchmarks.keys --keys 1000000,10000000 [--repeats 3] [--json FILE]
    python -m benchmarks.keys --smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

METHODS = ("fork", "spawn", "forkserver")
GOALS = {"ready_s_at_10m": 5.0, "main_growth_x": 1.5, "worker_mib": 20.0}
CLASSES = 1000
MIB = 1 << 20


def imagenet_keys(count: int) -> list[str]:
    """``count`` keys over 1000 class folders, sorted (as a listing returns them)."""
    per_class = -(-count // CLASSES)
    keys = []
    for c in range(CLASSES):
        synset = f"n{1440764 + c * 7919:08d}"
        first = 10000 + c
        for j in range(min(per_class, count - len(keys))):
            keys.append(f"train/{synset}/{synset}_{first + j}.JPEG")
    keys.sort()
    return keys


def write_manifests(count: int, directory: Path, dataset: str) -> tuple[dict[str, Path], int]:
    """The manifest forms of ``count`` keys under ``directory``, and the keys' raw bytes (an
    ImageFolder's manifest sits in ``train/``: its keys start at the class folder)."""
    keys = imagenet_keys(count)
    if dataset == "image-folder":
        keys = [k.removeprefix("train/") for k in keys]
    raw = sum(len(k.encode()) for k in keys)
    text = directory / f"keys-{count}.txt"
    text.write_text("".join(f"{k}\n" for k in keys), encoding="utf-8")
    forms = {"text": text}
    del keys
    from concurrent_loader import keys as keys_module

    if hasattr(keys_module, "parse_manifest_text"):  # the binary form exists
        binary = directory / f"keys-{count}.txt.bin"
        keys_module.parse_manifest_text(text.read_bytes()).save(binary)
        forms["binary"] = binary
    return forms, raw


def _uss() -> int:
    gc.collect()
    return int(psutil.Process().memory_full_info().uss)


def _worker(dataset: Any, results: Any) -> None:
    source = dataset.source
    targets = getattr(dataset, "targets", None)
    for i in range(len(source)):
        source.reads(i)
        if targets is not None:
            int(targets[i])
    results.put(_uss())


def worker_mib(dataset: Any, empty: Any, method: str) -> float:
    """USS of a worker that read every key, above that of a worker given a dataset of one key
    (which imported the same modules), in MiB."""
    context = mp.get_context(method)
    measured = []
    for payload in (empty, dataset):
        results = context.Queue()
        process = context.Process(target=_worker, args=(payload, results))
        process.start()
        measured.append(results.get())
        process.join()
    return (measured[1] - measured[0]) / MIB


def measure(manifest: Path, raw_bytes: int, methods: list[str], kind: str) -> dict[str, Any]:
    """In this (fresh) process: the figures of one manifest."""
    from concurrent_loader import ImageFolder, ObjectDataset

    gc.collect()
    before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    made = ImageFolder if kind == "image-folder" else ObjectDataset
    dataset = made.from_manifest(manifest, root=str(manifest.parent) + "/")
    ready = time.perf_counter() - started
    gc.collect()
    growth = psutil.Process().memory_info().rss - before
    empty = made(str(manifest.parent) + "/", keys=["n0/one.JPEG"])
    row: dict[str, Any] = {
        "keys": len(dataset),
        "ready_s": round(ready, 3),
        "main_growth_mib": round(growth / MIB, 1),
        "raw_key_mib": round(raw_bytes / MIB, 1),
        "main_growth_x": round(growth / raw_bytes, 2),
        "worker_mib": {m: round(worker_mib(dataset, empty, m), 1) for m in methods},
    }
    dataset.close()
    empty.close()
    return row


def run(
    counts: list[int], methods: list[str], kinds: list[str], repeats: int = 1
) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="keys-bench-") as tmp:
        for count, kind in [(c, k) for c in counts for k in kinds]:
            forms, raw = write_manifests(count, Path(tmp), kind)
            for form, path in forms.items():
                # A fresh process per manifest and repeat, so growth is this manifest's alone;
                # workers are measured in the first, the other repeats time ``ready`` only.
                readies = []
                for repeat in range(max(1, repeats)):
                    command = [sys.executable, "-m", "benchmarks.keys", "--child", str(path)]
                    command += [str(raw), "--methods", ",".join(methods) if repeat == 0 else ""]
                    child = subprocess.run(
                        [*command, "--datasets", kind], check=True, capture_output=True, text=True
                    )
                    measured = json.loads(child.stdout.splitlines()[-1])
                    readies.append(measured["ready_s"])
                    if repeat == 0:
                        row = {"dataset": kind, "form": form, **measured}
                row["ready_s"] = statistics.median(readies)
                row["ready_s_each"] = readies
                print(_line(row), file=sys.stderr, flush=True)
                rows.append(row)
                path.unlink()
    return rows


def _line(row: dict[str, Any]) -> str:
    workers = "  ".join(f"{m} {v:7.1f}" for m, v in row["worker_mib"].items())
    each = ", ".join(f"{r:.2f}" for r in row["ready_s_each"])
    return (
        f"{row['keys']:>10} keys  {row['dataset']:<12}  {row['form']:<6}  "
        f"ready {row['ready_s']:7.2f} s ({each})  main "
        f"+{row['main_growth_mib']:8.1f} MiB ({row['main_growth_x']:.2f}x raw "
        f"{row['raw_key_mib']:.1f} MiB)  workers (MiB above empty): {workers}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keys", description=__doc__)
    parser.add_argument("--keys", default="1000000,10000000", help="key counts, comma-separated")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--datasets", default="object,image-folder", help="object, image-folder")
    parser.add_argument("--smoke", action="store_true", help="20,000 keys: a CI check")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--repeats", type=int, default=1, help="ready timed in N processes")
    parser.add_argument(
        "--child", nargs=2, metavar=("MANIFEST", "RAW_BYTES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    kinds = [k for k in args.datasets.split(",") if k]
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), int(args.child[1]), methods, kinds[0])))
        return 0
    counts = [20_000] if args.smoke else [int(n) for n in args.keys.split(",")]
    rows = run(counts, methods, kinds, args.repeats)
    machine = f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / (1 << 30):.0f} GiB"
    result = {"rows": rows, "goals": GOALS, "machine": machine, "command": sys.argv}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
