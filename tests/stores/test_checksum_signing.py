"""A GET that asks for the object's checksum (``x-amz-checksum-mode: ENABLED``) is signed
exactly as botocore signs it, with and without a session token."""

from __future__ import annotations

import datetime

import botocore.auth
import botocore.credentials
import pytest
from botocore.awsrequest import AWSRequest

from concurrent_loader.stores.s3.sigv4 import Credentials, SigV4Signer, encode_s3_path

FROZEN = datetime.datetime(2025, 3, 1, 12, 0, 1)


@pytest.mark.parametrize(
    "credentials",
    [
        Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        Credentials("ASIAEXAMPLE", "secret/with+chars=", token="FQoGZXIvYXdzE//+token=="),
    ],
)
@pytest.mark.parametrize("key", ["plain.jpg", "ünïcødé/日本語 x+y.png"])
def test_checksum_mode_is_signed_as_botocore_signs_it(
    monkeypatch: pytest.MonkeyPatch, credentials: Credentials, key: str
) -> None:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: FROZEN)
    path = encode_s3_path("my-bucket", key)
    request = AWSRequest(
        method="GET",
        url=f"http://127.0.0.1:9000{path}",
        headers={"x-amz-checksum-mode": "ENABLED"},
    )
    boto = botocore.credentials.Credentials(
        credentials.access_key, credentials.secret_key, credentials.token
    )
    botocore.auth.S3SigV4Auth(boto, "s3", "us-east-1").add_auth(request)
    expected = {name.lower(): value for name, value in request.headers.items()}
    assert "x-amz-checksum-mode" in expected["authorization"]

    signer = SigV4Signer("us-east-1", checksum_mode=True)
    ours = signer.headers_for_get(
        "127.0.0.1:9000", path, credentials, amz_date=FROZEN.strftime("%Y%m%dT%H%M%SZ")
    )
    assert {name.lower(): value for name, value in ours} == expected
