"""Forking DataLoader workers right after a listing: the runtime must leave no thread behind.

A listing runs aiobotocore on this process's runtime, and aiobotocore builds its SSL
contexts on the loop's default executor. When the runtime closes it must join that
executor's threads: a worker forked while one of them is still exiting (inside OpenSSL's
per-thread cleanup) inherits OpenSSL's lock held, and hangs for ever in its first
``ssl.create_default_context()`` (seen here: a worker stuck in ``ssl_context_for`` from
``S3Store.__init__``, the test timing out, with SeaweedFS and with moto).
"""

from __future__ import annotations

import threading

from concurrent_loader.runtime import acquire_runtime


def test_runtime_joins_its_executor_threads():
    runtime = acquire_runtime()
    started, finish = threading.Event(), threading.Event()

    def job() -> None:  # what aiobotocore's asyncio.to_thread(...) does, made slow
        started.set()
        finish.wait(5)

    async def submit() -> None:
        runtime.loop.run_in_executor(None, job)

    runtime.run(submit())
    started.wait(5)
    threading.Timer(0.5, finish.set).start()  # the job ends half a second from now
    runtime.release()  # the last lease: closes the runtime
    left = [t.name for t in threading.enumerate() if t.name.startswith(("uvloop_", "asyncio_"))]
    finish.set()
    for thread in threading.enumerate():
        if thread.name.startswith(("uvloop_", "asyncio_")):
            thread.join(5)
    assert left == []
