"""RcloneS3Server against the real ``rclone serve s3``: a directory served as buckets, enforced
authentication, none of the user's rclone setup, the ranged answer the transport relies on,
lifecycle and cleanup."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from concurrent_loader.testing import RcloneS3Server


def _client(server: RcloneS3Server, access_key: str, secret_key: str) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=server.region,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


def test_a_directory_tree_is_served_as_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data" / "made-before" / "a" / "b").mkdir(parents=True)
    (tmp_path / "data" / "made-before" / "a" / "b" / "k.bin").write_bytes(b"on disk")
    # A user's rclone config and flags must not reach the server: this config names a
    # remote, and this variable would make it read-only.
    user_config = tmp_path / "user-rclone.conf"
    user_config.write_text("[remote]\ntype = local\n")
    monkeypatch.setenv("RCLONE_CONFIG", str(user_config))
    monkeypatch.setenv("RCLONE_READ_ONLY", "true")
    with RcloneS3Server(tmp_path / "data") as server:
        assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
        assert server.get_object("made-before", "a/b/k.bin") == b"on disk"
        server.create_bucket("new")
        server.create_bucket("new")  # no error if it exists
        server.put_object("new", "x/y.bin", b"written")
        assert (tmp_path / "data" / "new" / "x" / "y.bin").read_bytes() == b"written"
        assert str(user_config) not in server.log_tail()
    # A caller's data directory is kept.
    assert (tmp_path / "data" / "new" / "x" / "y.bin").is_file()


def test_authentication_is_enforced(rclone_server: RcloneS3Server) -> None:
    rclone_server.create_bucket("rclone-auth")
    rclone_server.put_object("rclone-auth", "k", b"secret bytes")
    for access_key, secret_key in [
        (rclone_server.access_key, "wrong-secret-key-wrong-secret-key-0000"),
        ("CLNOSUCHKEY000000000", rclone_server.secret_key),
    ]:
        client = _client(rclone_server, access_key, secret_key)
        with pytest.raises(botocore.exceptions.ClientError) as info:
            client.get_object(Bucket="rclone-auth", Key="k")
        client.close()
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_a_range_is_answered_with_200_and_exactly_its_bytes(rclone_server: RcloneS3Server) -> None:
    # What the transport's handling of a 200 for a range is tested against end to end
    # (the conformance suite's rclone case): if rclone ever answers 206, this says so.
    rclone_server.create_bucket("rclone-range")
    data = bytes(range(256)) * 4
    rclone_server.put_object("rclone-range", "r.bin", data)
    # botocore would check the whole object's checksum, which rclone sends, against the range.
    client = rclone_server.client(response_checksum_validation="when_required")
    try:
        answer = client.get_object(Bucket="rclone-range", Key="r.bin", Range="bytes=10-19")
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert answer["ContentRange"] == f"bytes 10-19/{len(data)}"
        assert answer["Body"].read() == data[10:20]
    finally:
        client.close()


def test_no_session_tokens(rclone_server: RcloneS3Server) -> None:
    with pytest.raises(NotImplementedError, match="no STS"):
        rclone_server.temporary_credentials()


def test_lifecycle() -> None:
    server = RcloneS3Server()
    with pytest.raises(RuntimeError, match="once the server started"):
        _ = server.data_dir
    with server:
        pid = server.pid
        data_dir = server.data_dir
        assert data_dir.is_dir()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not data_dir.exists()
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="only once"):
        server.start()
