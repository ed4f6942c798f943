"""LocalS3Server against the real ``weed mini`` and MotoS3Server against moto: auth, session
tokens, round trips, lifecycle, cleanup."""

from __future__ import annotations

import glob
import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore import UNSIGNED
from botocore.config import Config

from concurrent_loader.testing import LocalS3Server, MotoS3Server, S3ServerProcess


def _client(server: S3ServerProcess, access_key: str, secret_key: str) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=server.region,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )


def _anonymous(server: LocalS3Server) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint_url,
        region_name=server.region,
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
    )


_REFUSED_CREDENTIALS = {
    "InvalidToken",
    "InvalidAccessKeyId",
    "AccessDenied",
    "SignatureDoesNotMatch",
}


def _assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _sock_files(server: LocalS3Server) -> list[str]:
    return [p for port in server.ports.values() for p in glob.glob(f"/tmp/seaweedfs-*-{port}.sock")]


def test_put_get_round_trip(s3_server: LocalS3Server, s3_bucket: str) -> None:
    data = os.urandom(100_000)
    s3_server.put_object(s3_bucket, "server/round-trip.bin", data)
    assert s3_server.get_object(s3_bucket, "server/round-trip.bin") == data
    client = s3_server.client()
    try:
        listing = client.list_objects_v2(Bucket=s3_bucket, Prefix="server/")
        assert [o["Key"] for o in listing["Contents"]] == ["server/round-trip.bin"]
    finally:
        client.close()


def test_env_points_at_the_server(s3_server: LocalS3Server) -> None:
    env = s3_server.env()
    assert env["AWS_ENDPOINT_URL"] == s3_server.endpoint_url == f"http://127.0.0.1:{s3_server.port}"
    assert env["AWS_ACCESS_KEY_ID"] == s3_server.access_key
    assert env["AWS_SECRET_ACCESS_KEY"] == s3_server.secret_key
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"


def test_s3_env_fixture_sets_variables(s3_env: dict[str, str]) -> None:
    for name, value in s3_env.items():
        assert os.environ[name] == value


@pytest.mark.parametrize(
    ("access_key", "code"),
    [(None, "SignatureDoesNotMatch"), ("NOSUCHKEY0000000000", "InvalidAccessKeyId")],
)
def test_bad_credentials_get_403(
    s3_server: LocalS3Server, s3_bucket: str, access_key: str | None, code: str
) -> None:
    s3_server.put_object(s3_bucket, "server/secret.bin", b"x")
    client = _client(s3_server, access_key or s3_server.access_key, "wrong-secret-key")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.get_object(Bucket=s3_bucket, Key="server/secret.bin")
    client.close()
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert info.value.response["Error"]["Code"] == code


def test_anonymous_can_read_but_not_write(s3_server: LocalS3Server, s3_bucket: str) -> None:
    s3_server.put_object(s3_bucket, "server/public.bin", b"public bytes")
    url = f"{s3_server.endpoint_url}/{s3_bucket}/server/public.bin"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == b"public bytes"

    anonymous = _anonymous(s3_server)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        anonymous.put_object(Bucket=s3_bucket, Key="server/anon.bin", Body=b"no")
    anonymous.close()
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(urllib.error.HTTPError) as http_info:
        urllib.request.urlopen(f"{s3_server.endpoint_url}/{s3_bucket}/server/anon.bin", timeout=10)
    assert http_info.value.code == 404
    http_info.value.close()


def test_upload_dir_skips_objects_already_there(
    s3_server: LocalS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.bin").write_bytes(b"1" * 10)
    (tmp_path / "two.bin").write_bytes(b"2" * 20)
    assert s3_server.upload_dir(tmp_path, s3_bucket, prefix="upload-dir/") == 2
    assert s3_server.upload_dir(tmp_path, s3_bucket, prefix="upload-dir/") == 0
    (tmp_path / "two.bin").write_bytes(b"2" * 21)  # a size change means a new version
    assert s3_server.upload_dir(tmp_path, s3_bucket, prefix="upload-dir/") == 1
    assert s3_server.get_object(s3_bucket, "upload-dir/a/one.bin") == b"1" * 10
    assert s3_server.get_object(s3_bucket, "upload-dir/two.bin") == b"2" * 21


def test_image_dataset_fixture(s3_server: LocalS3Server, image_dataset: Any) -> None:
    assert image_dataset.s3_url == "s3://test-data/images/train/"
    assert image_dataset.classes == ["apple", "banana", "cherry"]
    assert len(image_dataset.files) == 24
    assert len({sha for _, _, sha in image_dataset.files}) == 24
    key, _, sha = image_dataset.files[5]
    remote = s3_server.get_object(image_dataset.bucket, image_dataset.prefix + key)
    assert hashlib.sha256(remote).hexdigest() == sha
    assert (image_dataset.local_root / key).read_bytes() == remote


def test_failed_start_reports_the_log(tmp_path: Path) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'cannot start: disk on fire' >&2\nexit 3\n")
    fake.chmod(0o755)
    server = LocalS3Server(weed_binary=str(fake))
    with pytest.raises(RuntimeError, match=r"status 3[\s\S]*disk on fire"):
        server.start()
    server.stop()  # idempotent after a failed start
    with pytest.raises(RuntimeError, match="only once"):
        server.start()


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        LocalS3Server(port=70000)
    with pytest.raises(ValueError):
        LocalS3Server(cpus=set())


@pytest.mark.slow
def test_side_by_side_stop_cleanup_and_persistence(
    s3_server: LocalS3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # Two more servers next to the session one: one temporary and CPU-pinned, one on a
    # caller-owned data dir that must survive a restart.
    kept_dir = tmp_path / "kept"
    with LocalS3Server(cpus={0}) as temp, LocalS3Server(data_dir=kept_dir) as kept:
        ports = set(temp.ports.values()) | set(kept.ports.values()) | set(s3_server.ports.values())
        assert len(ports) == 3 * len(temp.ports)
        assert os.sched_getaffinity(temp.pid) == {0}
        for task in os.listdir(f"/proc/{temp.pid}/task"):
            assert os.sched_getaffinity(int(task)) == {0}
        assert temp.cpu_seconds() > 0

        for server in (temp, kept):
            server.create_bucket("side")
            server.put_object("side", "who", server.endpoint_url.encode())
        assert temp.get_object("side", "who") == temp.endpoint_url.encode()
        assert kept.get_object("side", "who") == kept.endpoint_url.encode()
        s3_server.put_object(s3_bucket, "side/who", b"session")
        assert s3_server.get_object(s3_bucket, "side/who") == b"session"

        temp_pid, temp_dir = temp.pid, temp.data_dir
        assert temp_dir.is_dir() and not temp_dir.is_relative_to(kept_dir)
        assert _sock_files(temp)
        temp.stop()
        _assert_gone(temp_pid)
        assert not temp_dir.exists()
        assert _sock_files(temp) == []
        temp.stop()  # idempotent

        kept.get_object("side", "who")
        kept_pid = kept.pid
    _assert_gone(kept_pid)
    assert _sock_files(kept) == []
    assert kept_dir.is_dir()

    with LocalS3Server(data_dir=kept_dir) as again:
        assert again.get_object("side", "who") == kept.endpoint_url.encode()
        again.put_object("side", "after-restart", b"new")
        again.create_bucket("side-2")
        again.put_object("side-2", "k", b"other bucket")
        assert again.get_object("side", "after-restart") == b"new"
        assert again.get_object("side-2", "k") == b"other bucket"
        assert again.get_object("side", "who") == kept.endpoint_url.encode()


# -- moto's server, and what both servers share ---------------------------------------------


def test_moto_round_trip_and_enforced_authentication(moto_server: MotoS3Server) -> None:
    moto_server.create_bucket("moto-auth")
    moto_server.put_object("moto-auth", "a b/ü+%.bin", b"moto bytes")
    assert moto_server.get_object("moto-auth", "a b/ü+%.bin") == b"moto bytes"
    assert moto_server.access_key.startswith("AKIA")  # issued by moto's IAM
    assert moto_server.env()["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{moto_server.port}"
    for access_key, code in [
        (moto_server.access_key, "SignatureDoesNotMatch"),
        ("AKIANOSUCHKEY0000000", "InvalidAccessKeyId"),
    ]:
        client = _client(moto_server, access_key, "wrong-secret-key")
        with pytest.raises(botocore.exceptions.ClientError) as info:
            client.get_object(Bucket="moto-auth", Key="a b/ü+%.bin")
        client.close()
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert info.value.response["Error"]["Code"] == code


@pytest.mark.parametrize("server_fixture", ["s3_server", "moto_server"])
def test_temporary_credentials_need_their_token(
    request: pytest.FixtureRequest, server_fixture: str
) -> None:
    server: S3ServerProcess = request.getfixturevalue(server_fixture)
    server.create_bucket("sessions")
    server.put_object("sessions", "k", b"for the session")
    session = server.temporary_credentials()
    assert session.access_key != server.access_key
    assert session.secret_key not in repr(session) and session.session_token not in repr(session)
    assert set(session.env()) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}

    def client(token: str | None) -> Any:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=server.endpoint_url,
            aws_access_key_id=session.access_key,
            aws_secret_access_key=session.secret_key,
            aws_session_token=token,
            region_name=server.region,
            config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
        )

    good = client(session.session_token)
    assert good.get_object(Bucket="sessions", Key="k")["Body"].read() == b"for the session"
    good.close()
    for token in (None, session.session_token[:-8] + "AAAAAAAA"):
        bad = client(token)
        with pytest.raises(botocore.exceptions.ClientError) as info:
            bad.get_object(Bucket="sessions", Key="k")
        bad.close()
        # S3 answers a bad token 400 InvalidToken (moto does), or 403.
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] in (400, 403)
        assert info.value.response["Error"]["Code"] in _REFUSED_CREDENTIALS


def test_moto_lifecycle() -> None:
    server = MotoS3Server()
    with pytest.raises(RuntimeError, match="only once it started"):
        server.env()
    with server:
        pid = server.pid
        assert server.endpoint_url.startswith("http://127.0.0.1:")
    _assert_gone(pid)
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="only once"):
        server.start()
