"""An entry is keyed by where its bytes come from, however the endpoint was chosen: two
real servers holding the same bucket and key with different bytes never share an entry."""

from __future__ import annotations

import uuid

from concurrent_loader import ObjectDataset
from concurrent_loader.cache import CachedStoreConfig


def _read_one(bucket: str, cache_dir: str) -> bytes:
    # No endpoint_url=: the endpoint comes from AWS_ENDPOINT_URL, as botocore resolves it.
    dataset = ObjectDataset(f"s3://{bucket}/", keys=["same.bin"], cache=cache_dir)
    try:
        assert isinstance(dataset.store, CachedStoreConfig)
        return bytes(dataset[0])
    finally:
        dataset.close()


def test_two_endpoints_from_the_environment_never_share_an_entry(
    s3_server, moto_server, aws_env, cache_dir
):
    bucket = f"routes-{uuid.uuid4().hex[:8]}"
    servers = {s3_server: b"from SeaweedFS " * 64, moto_server: b"from moto " * 64}
    for server, data in servers.items():
        server.create_bucket(bucket)
        server.put_object(bucket, "same.bin", data)
    for _ in range(2):  # the second round reads both from the cache
        for server, data in servers.items():
            env = aws_env(server)
            assert env["AWS_ENDPOINT_URL"] == server.endpoint_url
            assert _read_one(bucket, str(cache_dir)) == data
