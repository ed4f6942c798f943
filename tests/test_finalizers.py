"""A dataset's or store's finalizer runs on whatever thread collects it, holding whatever
that thread holds (the runtime's own loop, the runtime's lock, the cache's ledger lock), at
any time, the process's exit included: it only queues its work (concurrent_loader.finish),
which is done on another thread or at the exit. Each case runs in a child process, so that
a regression hangs the child (killed after ``TIMEOUT_S``), not the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TIMEOUT_S = 60
ROOT = Path(__file__).resolve().parents[1]


def _child(code: str, tmp_path: Path, prelude: str = "") -> str:
    """Run ``prelude`` then ``code`` in a fresh interpreter; its stdout (it must end, and
    cleanly)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMP": str(tmp_path)}
    try:
        done = subprocess.run(
            [sys.executable, "-X", "dev", "-c", prelude + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the child hung: {exc.stderr!r}") from None
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    return done.stdout


# Two stores on one cache directory, each with a read; the second left to the collector.
_TWO_STORES = """
import asyncio, gc, os
from concurrent_loader.cache import CacheConfig, CachedStoreConfig
from concurrent_loader.config import FetchConfig
from concurrent_loader.testing.memory import MemoryConfig

cache = CacheConfig(os.environ["TMP"] + "/cache", max_bytes=10**7).resolved()
config = CachedStoreConfig(MemoryConfig({"a": b"x" * 100}), cache)
first, second = config.open(FetchConfig()), config.open(FetchConfig())

async def read():
    await first.get("a")
    await first.flush()
    await second.get("a")  # a hit, to be recorded when the store goes

asyncio.run(read())
second.cycle = second  # only the collector frees it
del second
"""


def test_a_store_collected_under_the_ledger_lock_of_another_finishes(tmp_path):
    # Two stores on one cache directory hold two open files, so the first one's ledger
    # lock would block the second's last write of its reads, on the thread that holds it.
    out = _child(
        """
        from concurrent_loader import finish
        from concurrent_loader.cache import describe_cache

        directory = first._dir
        with directory._locked_ledger(directory._h()):
            gc.collect()
        asyncio.run(first.close())
        finish.wait()  # the collected store's finish, queued
        info = describe_cache(cache.directory)
        print(info["hits"], info["misses"])
        """,
        tmp_path,
        _TWO_STORES,
    )
    assert out.split() == ["1", "1"]


def test_a_dataset_collected_on_the_runtime_s_own_loop_closes_it(tmp_path):
    out = _child(
        """
        import gc, threading
        from concurrent_loader import ObjectDataset
        from concurrent_loader.testing.memory import MemoryConfig

        ds = ObjectDataset(MemoryConfig({"a": b"x" * 100}), ["a"])
        assert len(ds[0]) == 100  # the dataset leases the runtime
        runtime = ds._runtime
        ds.cycle = ds
        del ds

        async def collect():
            gc.collect()  # the last lease returned on the loop's own thread

        runtime.run(collect())
        runtime._thread.join(10)
        print(runtime.closed, runtime._thread.is_alive())
        """,
        tmp_path,
    )
    assert out.split() == ["True", "False"]


def test_a_dataset_collected_under_the_runtime_s_lock_closes_it(tmp_path):
    out = _child(
        """
        import gc
        from concurrent_loader import ObjectDataset, finish, runtime as runtimes
        from concurrent_loader.testing.memory import MemoryConfig

        ds = ObjectDataset(MemoryConfig({"a": b"x" * 100}), ["a"])
        assert len(ds[0]) == 100
        runtime = ds._runtime
        ds.cycle = ds
        del ds
        with runtimes._lock:  # as in acquire_runtime, whose allocations may collect
            gc.collect()
        finish.wait()  # what the finalizer left
        print(runtime.closed, runtime._thread.is_alive())
        """,
        tmp_path,
    )
    assert out.split() == ["True", "False"]


def test_a_pool_shut_down_while_a_fork_holds_it_runs_its_jobs(tmp_path):
    out = _child(
        """
        from concurrent_loader import runtime
        from concurrent_loader.forkgate import GatedThreadPool

        pool = GatedThreadPool(1, "concurrent-loader-test")
        runtime._before_fork()  # a fork holds the pool: its jobs wait
        job = pool.submit(lambda: "ran")
        pool.shutdown(wait=False)  # gone from the pools a fork knows of
        runtime._after_fork_in_parent()
        print(job.result(timeout=10))
        """,
        tmp_path,
    )
    assert out.split() == ["ran"]


# A store's reads, recorded when it finishes: the ledger's hits and misses.
_LEDGER = """
from concurrent_loader.cache import describe_cache
info = describe_cache(os.environ["TMP"] + "/cache")
print(info["hits"] + info["misses"])
"""


def test_a_store_collected_at_exit_under_the_ledger_lock_of_another_finishes(tmp_path):
    _child(
        """
        import multiprocessing.util

        gc.disable()  # collected below, during the exit

        def during_exit():
            directory = first._dir
            with directory._locked_ledger(directory._h()):
                gc.collect()

        multiprocessing.util.Finalize(None, during_exit, exitpriority=20)
        """,
        tmp_path,
        _TWO_STORES,
    )
    assert _child("import os" + _LEDGER, tmp_path).split() == ["2"]  # both stores finished


def test_a_dataset_with_a_cache_left_open_at_exit_records_its_reads(tmp_path):
    _child(
        """
        import os
        from concurrent_loader import ObjectDataset
        from concurrent_loader.testing.memory import MemoryConfig

        cache = os.environ["TMP"] + "/cache"
        ds = ObjectDataset(MemoryConfig({"a": b"x" * 100}), ["a"], cache=cache)
        assert len(ds[0]) == 100 and len(ds[0]) == 100
        """,
        tmp_path,
    )
    assert _child("import os" + _LEDGER, tmp_path).split() == ["2"]


def test_a_dataset_collected_under_the_ledger_lock_leaves_its_close_to_another_thread(
    tmp_path,
):
    out = _child(
        """
        import gc, os, time
        from concurrent_loader import ObjectDataset, finish
        from concurrent_loader.cache import CacheConfig, CachedStoreConfig
        from concurrent_loader.config import FetchConfig
        from concurrent_loader.testing.memory import MemoryConfig

        cache = os.environ["TMP"] + "/cache"
        ds = ObjectDataset(MemoryConfig({"a": b"x" * 100}), ["a"], cache=cache)
        assert len(ds[0]) == 100  # its fetch client's store fills the cache
        runtime = ds._runtime
        config = CachedStoreConfig(MemoryConfig({}), CacheConfig(cache).resolved())
        other = config.open(FetchConfig())
        ds.cycle = ds
        del ds
        started = time.monotonic()
        with other._dir._locked_ledger(other._dir._h()):  # a writer inside put(), say
            gc.collect()  # the close needs that lock: it cannot happen here
        took = time.monotonic() - started
        finish.wait()
        print(took < 5, runtime.closed, runtime._thread.is_alive())
        """,
        tmp_path,
    )
    assert out.split() == ["True", "True", "False"]


def test_a_pipeline_collected_under_the_runtime_s_lock_returns_its_lease(tmp_path):
    # A pipeline's iterator is a generator: its finally block returns a lease on whatever
    # thread collects it, here one holding the runtime's lock (as acquire_runtime does).
    out = _child(
        """
        import gc, threading
        from concurrent_loader import ObjectDataset, finish, runtime as runtimes
        from concurrent_loader.pipeline import BatchPipeline, PipelineOptions
        from concurrent_loader.testing.memory import MemoryConfig

        ds = ObjectDataset(MemoryConfig({f"k{i}": b"x" * 10 for i in range(4)}))
        pipeline = BatchPipeline(ds, [[0, 1], [2, 3]], collate_fn=list, options=PipelineOptions())
        it = iter(pipeline)
        next(it)
        runtime = runtimes._current
        pipeline.it = it
        del it, pipeline
        done = threading.Event()

        def collect_under_lock():
            with runtimes._lock:
                gc.collect()
            done.set()

        threading.Thread(target=collect_under_lock, daemon=True).start()
        collected = done.wait(10)
        finish.wait()
        print(collected, runtime.closed)
        """,
        tmp_path,
    )
    assert out.split() == ["True", "True"]


def test_a_job_that_raises_leaves_the_queue_running(tmp_path):
    out = _child(
        """
        import asyncio, time
        from concurrent_loader import finish

        ran = []

        def cancelled():
            raise asyncio.CancelledError()  # a BaseException, not an Exception

        finish.later(cancelled)
        finish.later(lambda: ran.append("next"))
        time.sleep(0.5)
        finish.later(lambda: ran.append("later"))
        for _ in range(500):
            if len(ran) == 2:
                break
            time.sleep(0.01)
        print(*ran)
        """,
        tmp_path,
    )
    assert out.split() == ["next", "later"]
