"""Objects the proxy tests read through the proxy, uploaded once per test module."""

from __future__ import annotations

import os

import pytest

from concurrent_loader.testing import LocalS3Server

from ._proxy_support import BIG_KEY, SMALL_KEYS


@pytest.fixture(scope="module")
def objects(s3_server: LocalS3Server, s3_bucket: str) -> dict[str, bytes]:
    """One 300 KB object and a few 20 KB ones, by key."""
    data = {BIG_KEY: os.urandom(300_000)}
    data.update({key: os.urandom(20_000) for key in SMALL_KEYS})
    for key, body in data.items():
        s3_server.put_object(s3_bucket, key, body)
    return data
