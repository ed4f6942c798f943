"""No silent hang: :class:`StallWatch` waits on a future, logs a WARNING after each slice
without progress and, after ``timeout_s``, raises ``LoaderStalled`` naming what the process
waited for (``describe()``) with every thread's Python stack."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import LoaderStalled, Reason

__all__ = ["StallWatch", "thread_stacks"]

log = logging.getLogger(__name__)


def thread_stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts)


class StallWatch:
    """Waits that warn after ``warn_s`` and fail after ``timeout_s`` (None: never)."""

    def __init__(
        self,
        timeout_s: float | None,
        *,
        where: str,
        describe: Callable[[], str] = lambda: "",
    ) -> None:
        self.timeout_s = timeout_s
        self.warn_s = min(60.0, timeout_s / 5) if timeout_s else 60.0
        self.where = where
        self.describe = describe

    def wait(self, future: concurrent.futures.Future[Any], what: str) -> None:
        waited = 0.0
        while True:
            step = self.warn_s
            if self.timeout_s is not None:
                step = min(step, self.timeout_s - waited)
            try:
                future.exception(timeout=step)
                return
            except concurrent.futures.TimeoutError:
                waited += step
            except concurrent.futures.CancelledError:
                return
            state = self.describe()
            if self.timeout_s is not None and waited >= self.timeout_s:
                raise LoaderStalled(
                    f"{self.where} (pid {os.getpid()}) waited {waited:.1f} s for {what}; "
                    f"{state}\n{thread_stacks()}",
                    stage="loader",
                    cause=Reason.STALLED,
                )
            log.warning(
                "%s (pid %d) has waited %.1f s for %s; %s",
                self.where,
                os.getpid(),
                waited,
                what,
                state,
            )
