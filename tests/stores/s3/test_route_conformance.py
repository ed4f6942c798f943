"""Where our GET goes, compared with where botocore's own ``get_object`` goes, for every way
a user can configure S3: arguments, environment variables, config-file profiles and their
``services`` sections, ``AWS_ENDPOINT_URL(_S3)``, proxies and ``NO_PROXY``, CA bundles,
bucket-name shapes, and IPv4, IPv6 and paths in endpoints.

For each row, botocore's request is captured just before it would be sent (nothing leaves
the process); ours is the route :class:`S3Config` resolves plus the path our GET signs and
sends. They must agree on scheme, host, port, ``Host`` header, path, proxy and trust store.
``python tests/stores/s3/test_route_conformance.py`` prints the table.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from concurrent_loader.stores.s3 import S3Config
from concurrent_loader.stores.s3.sigv4 import encode_s3_key

KEY = "dir/a b+c%d/ü.jpg"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Row:
    name: str
    bucket: str = "data"
    #: dataset keyword arguments
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    #: the AWS config file's text, {ca} replaced by a CA bundle path
    config_file: str = ""


ROWS = [
    Row("endpoint_url argument, IPv4", options={"endpoint_url": "http://127.0.0.1:9000"}),
    Row("endpoint_url with a path", options={"endpoint_url": "https://gw.example.com:8443/s3"}),
    Row("endpoint_url, IPv6 literal", options={"endpoint_url": "http://[::1]:9000"}),
    Row("endpoint_url, https default port", options={"endpoint_url": "https://s3.example.com"}),
    Row("AWS_ENDPOINT_URL", env={"AWS_ENDPOINT_URL": "http://10.0.0.5:7480"}),
    Row(
        "AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL",
        env={"AWS_ENDPOINT_URL": "http://10.0.0.5:1", "AWS_ENDPOINT_URL_S3": "http://10.0.0.6:2"},
    ),
    Row(
        "argument over AWS_ENDPOINT_URL_S3",
        options={"endpoint_url": "http://10.0.0.7:3"},
        env={"AWS_ENDPOINT_URL_S3": "http://10.0.0.6:2"},
    ),
    Row(
        "profile endpoint_url via AWS_PROFILE",
        env={"AWS_PROFILE": "onprem"},
        config_file="[profile onprem]\nendpoint_url = https://minio.internal:9443\n",
    ),
    Row(
        "profile endpoint_url via profile=",
        options={"profile": "onprem"},
        config_file=(
            "[profile onprem]\nendpoint_url = http://ceph.internal:7480\n"
            "aws_access_key_id = AKIDPROFILE\naws_secret_access_key = secret\n"
        ),
    ),
    Row(
        "profile services section",
        env={"AWS_PROFILE": "svc"},
        config_file=(
            "[profile svc]\nservices = s3-local\nregion = eu-west-1\n\n"
            "[services s3-local]\ns3 =\n  endpoint_url = http://192.168.1.20:8333\n"
        ),
    ),
    Row(
        "default profile region",
        config_file="[default]\nregion = ap-southeast-2\n",
    ),
    Row("AWS, region argument", options={"region": "us-west-2"}),
    Row("AWS, AWS_DEFAULT_REGION", env={"AWS_DEFAULT_REGION": "eu-central-1"}),
    Row("AWS, bucket with dots", bucket="my.data.bucket", options={"region": "us-east-2"}),
    Row("AWS, bucket with uppercase", bucket="Legacy_Bucket", options={"region": "us-east-1"}),
    Row("AWS, addressing_style=path", options={"region": "us-west-2", "addressing_style": "path"}),
    Row(
        "endpoint, addressing_style=virtual",
        options={"endpoint_url": "http://s3.lab.example:9000", "addressing_style": "virtual"},
    ),
    Row(
        "profile addressing_style=path",
        env={"AWS_PROFILE": "p"},
        config_file="[profile p]\nregion = us-west-2\ns3 =\n  addressing_style = path\n",
    ),
    Row(
        "HTTPS_PROXY",
        options={"endpoint_url": "https://s3.example.com"},
        env={"HTTPS_PROXY": "http://proxy.corp:3128"},
    ),
    Row(
        "HTTP_PROXY with credentials",
        options={"endpoint_url": "http://s3.example.com:9000"},
        env={"HTTP_PROXY": "http://user:pw@proxy.corp:3128"},
    ),
    Row(
        "NO_PROXY matching the endpoint",
        options={"endpoint_url": "http://s3.example.com:9000"},
        env={"HTTP_PROXY": "http://proxy.corp:3128", "NO_PROXY": "s3.example.com"},
    ),
    Row(
        "NO_PROXY for another host",
        options={"endpoint_url": "http://s3.example.com:9000"},
        env={"HTTP_PROXY": "http://proxy.corp:3128", "NO_PROXY": "other.example.com"},
    ),
    Row(
        "AWS_CA_BUNDLE",
        options={"endpoint_url": "https://s3.example.com"},
        env={"AWS_CA_BUNDLE": "{ca}"},
    ),
    Row(
        "profile ca_bundle",
        options={"endpoint_url": "https://s3.example.com"},
        env={"AWS_PROFILE": "tls"},
        config_file="[profile tls]\nca_bundle = {ca}\n",
    ),
    Row(
        "REQUESTS_CA_BUNDLE",
        options={"endpoint_url": "https://s3.example.com"},
        env={"REQUESTS_CA_BUNDLE": "{ca}"},
    ),
]


@dataclass(frozen=True)
class Request:
    scheme: str
    host: str
    port: int
    host_header: str
    path: str
    proxy: str | None
    trust: str | None  # a CA bundle path, or None for the system store


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An environment with no AWS settings of the machine's, and fake credentials."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.lower() in ("http_proxy", "https_proxy", "no_proxy"):
            monkeypatch.delenv(name)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    (tmp_path / "config").write_text("")
    (tmp_path / "ca.pem").write_text("not read: only its path is compared\n")
    yield tmp_path


def apply(row: Row, folder: Path, setenv: Any) -> dict[str, Any]:
    ca = str(folder / "ca.pem")
    (folder / "config").write_text(row.config_file.replace("{ca}", ca))
    for name, value in row.env.items():
        setenv(name, value.replace("{ca}", ca))
    return dict(row.options)


def ours(row: Row, options: dict[str, Any]) -> Request:
    config = S3Config.from_url(f"s3://{row.bucket}/", **options).resolved()
    route = config.route
    assert route is not None
    origin = route.origin
    return Request(
        origin.scheme,
        origin.host,
        origin.port,
        origin.host_header,
        route.path_prefix + encode_s3_key(KEY),
        route.proxy,
        route.ca_bundle,
    )


class _Sent(Exception):
    pass


def botocores(row: Row, options: dict[str, Any]) -> Request:
    import botocore.session
    from botocore.config import Config

    session = botocore.session.Session(profile=options.get("profile"))
    style = options.get("addressing_style")
    client = session.create_client(
        "s3",
        endpoint_url=options.get("endpoint_url"),
        region_name=options.get("region"),
        config=Config(s3={"addressing_style": style} if style else None),
    )
    captured: list[Any] = []

    def capture(request: Any, **_: Any) -> None:
        captured.append(request)
        raise _Sent

    client.meta.events.register_first("before-send.s3.GetObject", capture)
    with pytest.raises(_Sent):
        client.get_object(Bucket=row.bucket, Key=KEY)
    http = client._endpoint.http_session  # what botocore's sender would use
    client.close()
    url = captured[0].url
    parts = urlsplit(url)
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    netloc = parts.netloc
    if parts.port == _DEFAULT_PORTS[parts.scheme]:
        netloc = netloc.rsplit(":", 1)[0]
    verify = http._verify
    return Request(
        parts.scheme,
        (parts.hostname or "").strip("[]"),
        port,
        netloc,
        parts.path,
        http._proxy_config.proxy_url_for(url),
        verify if isinstance(verify, str) else None,
    )


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_our_get_goes_where_botocores_goes(
    row: Row, aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = apply(row, aws_env, monkeypatch.setenv)
    assert ours(row, options) == botocores(row, options)


def test_an_explicit_ca_bundle_wins_over_the_environment(
    aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = aws_env / "explicit.pem"
    explicit.write_text("x\n")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(aws_env / "ca.pem"))
    config = S3Config.from_url(
        "s3://data/", endpoint_url="https://s3.example.com", ca_bundle=str(explicit)
    ).resolved()
    assert config.route is not None and config.route.ca_bundle == str(explicit)


def table() -> str:
    """The rows with what both resolve to (run this file as a script)."""
    import tempfile

    lines = [
        "| configuration | GET goes to | proxy | trust store | same as botocore |",
        "|---|---|---|---|---|",
    ]
    saved = dict(os.environ)
    try:
        for row in ROWS:
            with tempfile.TemporaryDirectory() as folder:
                os.environ.clear()
                os.environ.update(
                    AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
                    AWS_SECRET_ACCESS_KEY="secret",
                    AWS_CONFIG_FILE=f"{folder}/config",
                    AWS_SHARED_CREDENTIALS_FILE=f"{folder}/credentials",
                )
                Path(folder, "ca.pem").write_text("x\n")
                options = apply(row, Path(folder), os.environ.__setitem__)
                mine, theirs = ours(row, options), botocores(row, options)
                where = f"{mine.scheme}://{mine.host_header}{mine.path}"
                trust = "CA bundle" if mine.trust else "system"
                proxy = "yes" if mine.proxy else "no"
                lines.append(f"| {row.name} | `{where}` | {proxy} | {trust} | {mine == theirs} |")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
