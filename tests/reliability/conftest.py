"""Datasets shared by the reliability tests, uploaded once per session to their own bucket
(so that the thousands of objects here never show up in another test's listing)."""

from __future__ import annotations

import gc
import random
import sys
from collections.abc import Iterator

import pytest

from concurrent_loader.testing import LocalS3Server

from ._support import StoredObjects, child_pids, upload_objects

BUCKET = "reliability"
SMALL_PREFIX = "small/"
SMALL_COUNT = 2000
SMALL_SEED = 20251121


@pytest.fixture(scope="session")
def reliability_bucket(s3_server: LocalS3Server) -> str:
    """A bucket of the session's server for this suite's objects."""
    s3_server.create_bucket(BUCKET)
    return BUCKET


@pytest.fixture(scope="session")
def small_objects(
    tmp_path_factory: pytest.TempPathFactory, s3_server: LocalS3Server, reliability_bucket: str
) -> StoredObjects:
    """2,000 objects of 1-4 KB random bytes under ``s3://reliability/small/``."""
    rng = random.Random(SMALL_SEED)
    bodies = {f"{i:05d}.bin": rng.randbytes(rng.randint(1024, 4096)) for i in range(SMALL_COUNT)}
    root = tmp_path_factory.mktemp("reliability_small")
    return upload_objects(s3_server, reliability_bucket, SMALL_PREFIX, bodies, root)


@pytest.fixture(autouse=True)
def _release_leftover_workers() -> Iterator[None]:
    """Keep one test's leftovers from stalling the next one.

    A failing test's traceback (kept by pytest in ``sys.last_traceback``) may hold a
    loader's iterator and, through it, its worker processes; collecting it later, in
    another test, would make that test pay for the workers' shutdown. The tests that are
    about shutdown check leftovers themselves, before this runs.
    """
    before = child_pids()
    yield
    if child_pids() - before:
        sys.last_type = sys.last_value = sys.last_traceback = None
        gc.collect()
