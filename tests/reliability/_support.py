"""Helpers shared by the reliability tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from torch.utils.data import DataLoader

from concurrent_loader.testing import LocalS3Server


def sha256_hex(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_batches(n: int, batch_size: int, seed: int) -> list[list[int]]:
    """The batches a stock DataLoader draws with ``shuffle=True`` and a generator seeded
    with ``seed``."""
    stock = DataLoader(
        range(n), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    return [batch.tolist() for batch in stock]


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def tcp_connections() -> set[tuple[int, tuple, tuple, str]]:
    """The TCP sockets this process holds open (by file descriptor), as comparable tuples."""
    return {
        (c.fd, tuple(c.laddr), tuple(c.raddr) if c.raddr else (), c.status)
        for c in psutil.Process().net_connections(kind="tcp")
    }


def child_pids() -> set[int]:
    """Live (non-zombie) descendants of this process."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


@dataclass
class Resources:
    """Threads, child processes and TCP sockets of this process at one moment."""

    threads: set[threading.Thread]
    children: set[int]
    sockets: set[tuple[int, tuple, tuple, str]]

    @classmethod
    def now(cls) -> Resources:
        return cls(set(threading.enumerate()), child_pids(), tcp_connections())

    def leftovers(self) -> dict[str, list[object]]:
        """What exists now that did not exist when this snapshot was taken."""
        current = Resources.now()
        left: dict[str, list[object]] = {}
        threads = [t for t in current.threads - self.threads if t.is_alive()]
        if threads:
            left["threads"] = threads
        children = sorted(current.children - self.children)
        if children:
            left["children"] = [_describe(pid) for pid in children]
        sockets = sorted(current.sockets - self.sockets)
        if sockets:
            left["sockets"] = list(sockets)
        return left

    def wait_clean(self, timeout: float) -> tuple[float, dict[str, list[object]]]:
        """Seconds until nothing is left over (or ``timeout``), and what is left then."""
        started = time.monotonic()
        left = self.leftovers()
        while left and time.monotonic() - started < timeout:
            time.sleep(0.02)
            left = self.leftovers()
        return time.monotonic() - started, left


def _describe(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return f"pid {pid} ({proc.status()}): {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {pid} (gone)"


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class StoredObjects:
    """Objects under ``s3://bucket/prefix``: their keys (relative to it) and sha256 digests."""

    bucket: str
    prefix: str
    keys: list[str]
    digests: list[str]

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def upload_objects(
    server: LocalS3Server, bucket: str, prefix: str, bodies: dict[str, bytes], root: Path
) -> StoredObjects:
    """Write ``bodies`` under ``root`` and upload them with one client and a thread pool."""
    for key, body in bodies.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    server.upload_dir(root, bucket, prefix=prefix, max_workers=16)
    keys = sorted(bodies)
    return StoredObjects(bucket, prefix, keys, [sha256_hex(bodies[k]) for k in keys])
