"""What the testing tools share to run a helper (the S3 server, the proxy) as a child process.

* :class:`ChildProcess` gives a helper with ``start()``, ``stop()`` and ``pid`` its
  context manager and :meth:`~ChildProcess.cpu_seconds`.
* :func:`terminate_process` always reaps the child, even one that ignores SIGTERM.
* :func:`check_cpus` validates a CPU set before any process is started with it.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import subprocess
from collections.abc import Iterable
from typing import IO, Any, Self

__all__ = [
    "ChildProcess",
    "Started",
    "check_cpus",
    "process_cpu_seconds",
    "tail_of",
    "terminate_process",
]

logger = logging.getLogger(__name__)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (its threads included)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name may contain spaces and parentheses: fields start after the last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def check_cpus(cpus: Iterable[int] | None) -> frozenset[int] | None:
    """Validate a CPU set for ``os.sched_setaffinity``; ValueError when unusable."""
    if cpus is None:
        return None
    chosen = frozenset(cpus)
    available = os.cpu_count() or 1
    if not chosen or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < available for c in chosen
    ):
        raise ValueError(
            f"cpus must be a non-empty set of CPU ids in [0, {available}), got {cpus!r}"
        )
    return chosen


def terminate_process(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; always reaps the child."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("pid %d ignored SIGTERM for %.1fs, killing it", proc.pid, grace_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


def tail_of(file: IO[bytes], max_bytes: int = 4000) -> str:
    """The last ``max_bytes`` of a log file, for error messages."""
    file.flush()
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - max_bytes))
    return file.read().decode("utf-8", "replace")


class Started:
    """Mixin: ``with obj:`` returns ``obj.start()`` and calls ``obj.stop()`` on the way out."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class ChildProcess(Started, abc.ABC):
    """A helper that runs as a child process: ``with`` starts it and stops it."""

    @abc.abstractmethod
    def start(self) -> Self:
        """Start the child; returns once it is ready."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the child and release what it held. Idempotent."""

    @property
    @abc.abstractmethod
    def pid(self) -> int:
        """The child's process id; RuntimeError before it was started."""

    def cpu_seconds(self) -> float:
        """User + system CPU time the child has used so far."""
        return process_cpu_seconds(self.pid)
