"""Worker start-up cost per start method: time from ``iter(loader)`` to each worker's first
GET, and that worker's memory then.

For each start method (``fork``, ``forkserver``, ``spawn``) a 2-worker
:class:`~concurrent_loader.ConcurrentDataLoader` over an S3 dataset is iterated
``--repeats`` times, a new iterator (new workers) each time. A ``worker_init_fn`` wraps the
S3 store's ``get`` in each worker; its first call (the GET is about to be sent) records:

- ``first_get_s``: wall-clock seconds since the main process called ``iter()``: process
  start (fork, or a new interpreter importing torch for spawn and forkserver), the worker's
  event loop, its fetch client (credentials, TLS) and the first sample's GET;
- ``rss_mb`` and ``uss_mb``: the worker's resident and unique set sizes (USS: the pages no
  other process shares, what a forked worker really adds);
- ``ssl_contexts``: ``SSLContext`` objects the worker made before that GET;
- ``botocore``: whether botocore was imported in the worker by then (spawn and forkserver
  workers start without it; a forked one inherits the main process's modules).

The table shows the median over every worker of every repeat, and the min-max. Without
``--endpoint-url`` it starts :class:`concurrent_loader.testing.LocalS3Server` (plain http)::

    python benchmarks/worker_start.py --repeats 5

``measure()`` runs the same from Python (the smoke test calls it with tiny sizes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Run as a script (``python benchmarks/worker_start.py``) the repository root is not on sys.path.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

CONTEXTS = ("fork", "forkserver", "spawn")


@dataclass(frozen=True)
class WorkerStart:
    """One worker's start, up to its first GET."""

    context: str
    repeat: int
    worker: int
    first_get_s: float
    rss_mb: float
    uss_mb: float
    ssl_contexts: int
    botocore: bool


@dataclass(frozen=True)
class Summary:
    """Medians (and ranges) over every worker of every repeat of one start method."""

    context: str
    workers: int
    first_get_s: float
    first_get_range: tuple[float, float]
    rss_mb: float
    uss_mb: float
    uss_range: tuple[float, float]
    ssl_contexts: float
    botocore: float


def _probe_worker(out_dir: str, context: str, repeat: int, worker_id: int) -> None:
    """``worker_init_fn``: record this worker's first GET (see the module docstring)."""
    import psutil

    from concurrent_loader.stores.s3.store import S3Store

    made = [0]
    new = ssl.SSLContext.__new__

    def counting_new(cls: type[ssl.SSLContext], *args: Any, **kwargs: Any) -> ssl.SSLContext:
        made[0] += 1
        return new(cls, *args, **kwargs)

    ssl.SSLContext.__new__ = counting_new  # type: ignore[method-assign, assignment]
    get = S3Store.get
    seen = [False]

    async def first_get_recorded(self: S3Store, *args: Any, **kwargs: Any) -> Any:
        if not seen[0]:
            seen[0] = True
            now = time.time()
            memory = psutil.Process().memory_full_info()
            record = {
                "context": context,
                "repeat": repeat,
                "worker": worker_id,
                "at": now,
                "rss_mb": memory.rss / 2**20,
                "uss_mb": memory.uss / 2**20,
                "ssl_contexts": made[0],
                "botocore": "botocore" in sys.modules,
            }
            path = Path(out_dir) / f"{context}-{repeat}-{worker_id}.json"
            path.write_text(json.dumps(record))
        return await get(self, *args, **kwargs)

    S3Store.get = first_get_recorded  # type: ignore[method-assign]


def measure(
    url: str,
    keys: Sequence[str],
    *,
    contexts: Sequence[str] = CONTEXTS,
    workers: int = 2,
    repeats: int = 3,
) -> list[WorkerStart]:
    """Start ``repeats`` iterators of ``workers`` workers per start method over ``keys``
    under ``url`` (the AWS_* environment says how to reach it); every worker's start."""
    import torch.multiprocessing as mp

    from concurrent_loader import ConcurrentDataLoader, ObjectDataset

    dataset = ObjectDataset(url, list(keys))
    starts: list[WorkerStart] = []
    with tempfile.TemporaryDirectory(prefix="worker-start-") as out_dir:
        for context in contexts:
            if context not in mp.get_all_start_methods():
                continue
            for repeat in range(repeats):
                loader = ConcurrentDataLoader(
                    dataset,
                    batch_size=1,
                    num_workers=workers,
                    multiprocessing_context=context,
                    worker_init_fn=functools.partial(_probe_worker, out_dir, context, repeat),
                    stall_timeout_s=60.0,
                )
                began = time.time()
                iterator = iter(loader)
                for _ in range(workers):  # one batch from each worker: all have started
                    next(iterator)
                del iterator
                for worker in range(workers):
                    record = json.loads(
                        (Path(out_dir) / f"{context}-{repeat}-{worker}.json").read_text()
                    )
                    starts.append(
                        WorkerStart(
                            context,
                            repeat,
                            worker,
                            record["at"] - began,
                            record["rss_mb"],
                            record["uss_mb"],
                            record["ssl_contexts"],
                            record["botocore"],
                        )
                    )
    dataset.close()
    return starts


def summarize(starts: Sequence[WorkerStart]) -> list[Summary]:
    summaries = []
    for context in dict.fromkeys(s.context for s in starts):
        mine = [s for s in starts if s.context == context]
        first = [s.first_get_s for s in mine]
        uss = [s.uss_mb for s in mine]
        summaries.append(
            Summary(
                context,
                len(mine),
                statistics.median(first),
                (min(first), max(first)),
                statistics.median(s.rss_mb for s in mine),
                statistics.median(uss),
                (min(uss), max(uss)),
                statistics.median(s.ssl_contexts for s in mine),
                sum(s.botocore for s in mine) / len(mine),
            )
        )
    return summaries


def format_table(summaries: Sequence[Summary]) -> str:
    lines = [
        "| start method | workers | iter() -> first GET, s (min-max) | RSS MB | USS MB (min-max)"
        " | SSLContexts made | botocore imported |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.context} | {s.workers} | {s.first_get_s:.3f} ({s.first_get_range[0]:.3f}-"
            f"{s.first_get_range[1]:.3f}) | {s.rss_mb:.0f} | {s.uss_mb:.1f} "
            f"({s.uss_range[0]:.1f}-{s.uss_range[1]:.1f}) | {s.ssl_contexts:.0f} "
            f"| {s.botocore:.0%} of workers |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def _local_server(objects: int) -> Iterator[tuple[str, list[str]]]:
    """A LocalS3Server with ``objects`` small objects; the AWS_* env set meanwhile."""
    from concurrent_loader.testing import LocalS3Server

    saved = dict(os.environ)
    with LocalS3Server() as server, tempfile.TemporaryDirectory() as tmp:
        server.create_bucket("worker-start")
        root = Path(tmp)
        keys = [f"{i:04d}.bin" for i in range(objects)]
        for key in keys:
            (root / key).write_bytes(os.urandom(1024))
        server.upload_dir(root, "worker-start", prefix="objects/")
        os.environ.update(server.env())
        os.environ["AWS_CONFIG_FILE"] = os.devnull
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
            os.environ.pop(name, None)
        try:
            yield "s3://worker-start/objects/", keys
        finally:
            os.environ.clear()
            os.environ.update(saved)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default=",".join(CONTEXTS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument(
        "--url", help="s3://bucket/prefix/ to read (with --keys); else a local server"
    )
    parser.add_argument("--keys", help="comma-separated keys under --url")
    parser.add_argument("--json", help="also write every worker's figures to this file")
    args = parser.parse_args(argv)
    contexts = [c for c in args.contexts.split(",") if c]
    if args.url and not args.keys:
        parser.error("--url needs --keys")
    if args.url:
        starts = measure(
            args.url,
            args.keys.split(","),
            contexts=contexts,
            workers=args.workers,
            repeats=args.repeats,
        )
    else:
        with _local_server(max(args.objects, args.workers)) as (url, keys):
            starts = measure(
                url, keys, contexts=contexts, workers=args.workers, repeats=args.repeats
            )
    print(format_table(summarize(starts)))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(s) for s in starts], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
