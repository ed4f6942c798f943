"""Secrets never reach logs, reprs, error messages, tracebacks or (unless passed explicitly)
pickles; TLS certificates are verified by default."""

from __future__ import annotations

import http.server
import logging
import pickle
import shutil
import ssl
import subprocess
import threading
import time
import traceback

import pytest

from concurrent_loader import (
    AccessDenied,
    ConcurrentDataLoader,
    FetchConfig,
    FetchError,
    ObjectDataset,
)
from concurrent_loader.fetch import client_for
from concurrent_loader.runtime import acquire_runtime
from concurrent_loader.stores import CredentialSource, S3Config
from concurrent_loader.stores.s3.sigv4 import Credentials

from ._support import sha256_hex

# Distinctive values that cannot appear anywhere by chance.
WRONG_SECRET = "WrOnGsEcReT0rel1ab1l1ty0wrongsecretXYZ12"
TOKEN = "SeSsIoNt0kEn0rel1ab1l1ty0FQoGZXIvYXdzEJr//////////wEaDFAKE"


def _set_credentials(monkeypatch, s3_server, source: str, secret: str, token: str | None):
    """Credentials for S3Config.from_url: keyword arguments ("explicit") or the environment."""
    if source == "explicit":
        return {
            "aws_access_key_id": s3_server.access_key,
            "aws_secret_access_key": secret,
            "aws_session_token": token,
        }
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    if token is not None:
        monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    return {}


def _error_texts(error: BaseException) -> list[str]:
    """Everything a user or a log handler may print of an error, causes and notes included."""
    return [
        str(error),
        repr(error),
        "".join(traceback.format_exception(error)),
        pickle.dumps(error).decode("latin-1"),
    ]


def _client_repr(ds: ObjectDataset) -> str:
    runtime = acquire_runtime()
    try:
        client = runtime.run(client_for(runtime, ds.store, ds.fetch_config))
        store = client.store
        return f"{client!r} {client!s} {store!r} {vars(store).get('_credentials')!r}"
    finally:
        runtime.release()


def _assert_hidden(secrets: list[str], texts: list[str], where: str) -> None:
    for secret in secrets:
        for text in texts:
            assert secret not in text, f"a secret appears in {where}: ...{_around(text, secret)}..."


def _around(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(0, at - 120) : at + len(secret) + 40]


@pytest.mark.parametrize("source", ["explicit", "env"])
@pytest.mark.parametrize("outcome", ["read", "denied"])
def test_secrets_stay_out_of_logs_reprs_errors_and_pickles(
    small_objects, s3_server, s3_env, monkeypatch, caplog, source, outcome
):
    caplog.set_level(logging.DEBUG)  # the root logger: ours, botocore's, everyone's
    if outcome == "read":
        secrets = [s3_server.secret_key]
        kwargs = _set_credentials(monkeypatch, s3_server, source, s3_server.secret_key, None)
    else:
        secrets = [WRONG_SECRET, TOKEN]
        kwargs = _set_credentials(monkeypatch, s3_server, source, WRONG_SECRET, TOKEN)

    keys = small_objects.keys[:16]
    ds = ObjectDataset(S3Config.from_url(small_objects.url, **kwargs), keys, decode=sha256_hex)
    loader = ConcurrentDataLoader(ds, batch_size=4)
    texts = [
        repr(ds),
        str(ds),
        repr(ds.store),
        repr(ds.fetch_config),
        repr(loader),
        repr(loader.dataset),
        _client_repr(ds),
    ]
    if outcome == "read":
        assert [d for b in loader for d in b] == small_objects.digests[:16]
    else:
        for num_workers in (0, 2):
            started = time.monotonic()
            with pytest.raises(AccessDenied) as info:
                next(iter(ConcurrentDataLoader(ds, batch_size=4, num_workers=num_workers)))
            assert time.monotonic() - started < 10
            texts += _error_texts(info.value)
            del info
    _assert_hidden(secrets, texts, "a repr or an error")
    assert caplog.records, "nothing was logged: the capture is not working"
    _assert_hidden(secrets, [caplog.text], "the DEBUG logs")

    pickled = pickle.dumps(ds)
    if source == "env":
        # Workers resolve the environment themselves: nothing secret travels.
        _assert_hidden(secrets, [pickled.decode("latin-1")], "the pickled dataset")
    else:
        # Explicit keys travel, because the workers need them to sign: and only for that.
        copy = pickle.loads(pickled)
        assert copy.store == ds.store
        _assert_hidden(secrets, [repr(copy), repr(copy.store)], "an unpickled repr")


@pytest.mark.parametrize("source", ["explicit", "env"])
@pytest.mark.parametrize("outcome", ["listed", "denied"])
def test_listing_keeps_secrets_out_of_logs_and_errors(
    small_objects, s3_server, s3_env, monkeypatch, caplog, source, outcome
):
    """The listing goes through botocore, whose DEBUG logs print request headers."""
    caplog.set_level(logging.DEBUG)
    if outcome == "listed":
        secrets = [s3_server.secret_key]
        kwargs = _set_credentials(monkeypatch, s3_server, source, s3_server.secret_key, None)
        dataset = ObjectDataset(S3Config.from_url(small_objects.url, **kwargs))
        assert len(dataset) == len(small_objects.keys)
        texts = []
    else:
        secrets = [WRONG_SECRET, TOKEN]
        kwargs = _set_credentials(monkeypatch, s3_server, source, WRONG_SECRET, TOKEN)
        with pytest.raises(AccessDenied) as info:
            ObjectDataset(S3Config.from_url(small_objects.url, **kwargs))
        texts = _error_texts(info.value)
    assert any(r.name.startswith("botocore") for r in caplog.records), "botocore logged nothing"
    _assert_hidden(secrets, texts, "the listing error")
    _assert_hidden(secrets, [caplog.text], "the DEBUG logs of a listing")


def test_credential_reprs_hide_secrets():
    source = CredentialSource(
        access_key="AKIDEXAMPLE", secret_key=WRONG_SECRET, session_token=TOKEN
    )
    frozen = Credentials("AKIDEXAMPLE", WRONG_SECRET, TOKEN)
    _assert_hidden([WRONG_SECRET, TOKEN], [repr(source), str(source), repr(frozen)], "a repr")


# ---------------------------------------------------------------------------- TLS


def test_tls_verification_is_on_by_default(small_objects, s3_env):
    assert FetchConfig().verify_tls is True
    assert ObjectDataset(small_objects.url, ["x"]).fetch_config.verify_tls is True


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello over tls"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # refused handshakes are what these tests provoke


@pytest.fixture(scope="module")
def self_signed_https(tmp_path_factory):
    """``https://127.0.0.1:<port>`` served with a freshly made self-signed certificate."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = _QuietServer(("127.0.0.1", 0), _Hello)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="tls-test-server", daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("kind", ["https", "s3"])
def test_self_signed_certificate_is_refused(self_signed_https, s3_env, kind):
    if kind == "https":
        root: str | S3Config = f"{self_signed_https}/data/"
        url = f"{self_signed_https}/data/hello.bin"
    else:
        root = S3Config.from_url("s3://bucket/data/", endpoint_url=self_signed_https)
        url = "s3://bucket/data/hello.bin"

    def first(config: FetchConfig | None):
        ds = ObjectDataset(root, ["hello.bin"], fetch_config=config)
        return next(iter(ConcurrentDataLoader(ds, batch_size=1)))

    started = time.monotonic()
    with pytest.raises(FetchError) as info:
        first(None)
    assert time.monotonic() - started < 10
    assert info.value.url == url
    chain, seen = [], info.value
    while seen is not None:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) or (
        "CERTIFICATE_VERIFY_FAILED" in str(info.value)
    ), [repr(e) for e in chain]
    # Control: the same server is readable once verification is turned off on purpose.
    del info
    assert first(FetchConfig(verify_tls=False)) == [b"hello over tls"]
