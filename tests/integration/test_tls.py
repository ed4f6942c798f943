"""HTTPS end to end: each server behind a TLS front whose certificate a private CA signed.

The CA is made at test time and is in no trust store, so by default the certificate is
refused (``CertificateRefused``, naming the object, after one attempt: the front counts
the handshakes); trusted through ``AWS_CA_BUNDLE``, a profile's ``ca_bundle`` in the
config file, or the ``ca_bundle=`` option, the GETs and the listing both succeed and the
data is byte-identical.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset, RetryConfig
from concurrent_loader.errors import CertificateRefused, Reason
from concurrent_loader.stores import S3Config
from concurrent_loader.testing import ServerCertificate, TlsFront

from .conftest import ServerData, attempts_of, drop_traceback

KEY = "ünïcödé/日本語 ✓.bin"


@pytest.fixture
def tls_front(
    server_data: ServerData, private_ca: ServerCertificate, server_env, monkeypatch
) -> Iterator[TlsFront]:
    """HTTPS in front of the server, which the AWS_* variables point at for this test."""
    with TlsFront(server_data.server.endpoint_url, private_ca) as front:
        monkeypatch.setenv("AWS_ENDPOINT_URL", front.endpoint_url)
        yield front


def read_sorted(ds: ObjectDataset, front: TlsFront) -> list[bytes]:
    # No handshake of the listing still going on in this process when workers fork.
    front.wait_idle()
    loader = ConcurrentDataLoader(
        ds, batch_size=4, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(1)
    )
    got = [body for batch in loader for body in batch]
    assert len(got) == len(ds)
    return sorted(got)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_untrusted_certificate_is_refused_after_one_attempt(
    server_data: ServerData, tls_front: TlsFront, num_workers
):
    ds = ObjectDataset(server_data.odd_url, [KEY])
    loader = ConcurrentDataLoader(ds, batch_size=1, num_workers=num_workers)
    with pytest.raises(CertificateRefused) as info:
        list(loader)
    error = drop_traceback(info)
    assert isinstance(error, CertificateRefused)
    assert error.url == server_data.odd_url + KEY
    assert error.cause == Reason.CERTIFICATE_REFUSED
    assert server_data.odd_url + KEY in str(error)
    # Not retried: one connection, one failed handshake, and the client says one attempt.
    assert attempts_of(error) == 1
    tls_front.wait_idle()
    assert (tls_front.connections, tls_front.refused, tls_front.handshakes) == (1, 1, 0)


def test_untrusted_certificate_is_refused_when_listing(server_data: ServerData, tls_front):
    # One attempt allowed, so that the retries of the bug below cost little time here.
    one_attempt = FetchConfig(retry=RetryConfig(max_attempts=1))
    with pytest.raises(CertificateRefused) as info:
        ObjectDataset(server_data.odd_url, fetch_config=one_attempt)
    error = drop_traceback(info)
    assert isinstance(error, CertificateRefused)
    assert error.url == server_data.odd_url
    assert server_data.odd_url in str(error)
    assert tls_front.handshakes == 0


def test_untrusted_certificate_is_not_retried_when_listing(server_data: ServerData, tls_front):
    with pytest.raises(CertificateRefused) as info:
        ObjectDataset(server_data.odd_url)
    drop_traceback(info)
    tls_front.wait_idle()
    assert tls_front.connections == 1


def _check_trusted(server_data: ServerData, front: TlsFront, **options) -> None:
    root = S3Config.from_url(server_data.odd_url, **options)
    ds = ObjectDataset(root)  # listed through the front
    assert list(ds.keys) == sorted(server_data.odd)
    assert read_sorted(ds, front) == sorted(server_data.odd.values())
    assert front.handshakes >= 2 and front.refused == 0


def test_trusted_through_aws_ca_bundle(
    server_data: ServerData, tls_front: TlsFront, private_ca: ServerCertificate, monkeypatch
):
    monkeypatch.setenv("AWS_CA_BUNDLE", str(private_ca.ca_bundle))
    _check_trusted(server_data, tls_front)


def test_trusted_through_the_config_files_ca_bundle(
    server_data: ServerData,
    tls_front: TlsFront,
    private_ca: ServerCertificate,
    monkeypatch,
    tmp_path,
):
    config = tmp_path / "config"
    config.write_text(
        f"[profile private-ca]\nca_bundle = {private_ca.ca_bundle}\n"
        f"region = {server_data.server.region}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "private-ca")
    _check_trusted(server_data, tls_front)


def test_trusted_through_the_ca_bundle_option(
    server_data: ServerData, tls_front: TlsFront, private_ca: ServerCertificate
):
    _check_trusted(server_data, tls_front, ca_bundle=str(private_ca.ca_bundle))


_LISTING = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bkt</Name>'
    b"<Prefix></Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>"
    b"<IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>5</Size></Contents>"
    b"</ListBucketResult>"
)


class _ClosingListingServer:
    """HTTPS on loopback that answers one ListObjectsV2 with ``Connection: close`` (as moto
    answers everything), then neither reads nor closes for ``hold_s`` (or until stopped):
    the client's TLS shutdown is in progress meanwhile."""

    def __init__(self, certificate: ServerCertificate, hold_s: float) -> None:
        self._context = certificate.server_context()
        self._hold_s = hold_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with self._context.wrap_socket(conn, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(4096)
            tls.sendall(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/xml\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(_LISTING), _LISTING)
            )
            self._done.wait(self._hold_s)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._listener.close()


def _list_once(certificate: ServerCertificate, hold_s: float, close_timeout_s: float) -> float:
    """List the server's bucket once in a child process, whose runtime waits up to
    ``close_timeout_s`` for connections closing; the seconds the runtime took to close
    after the listing. In a child: a loop that fails to close leaks its socket and its executor's
    thread for the rest of the process."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name.upper() not in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY")
    }
    server = _ClosingListingServer(certificate, hold_s)
    try:
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                _LIST_ONCE,
                f"https://127.0.0.1:{server.port}",
                str(close_timeout_s),
            ],
            cwd=Path(__file__).resolve().parents[2],
            env={**env, "CA_BUNDLE": str(certificate.ca_bundle)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.stop()
    lines = child.stdout.splitlines()
    assert lines[-1:] == ["listed ['k']"], child.stderr
    # No transport left open, and the runtime's thread closed its loop without an error.
    assert child.returncode == 0, child.stdout + child.stderr
    return float(lines[-2].split()[-1])


def test_runtime_waits_for_tls_connections_closing(private_ca: ServerCertificate):
    # The server closes 0.5 s after its answer: the TLS shutdown ends then, within the wait.
    assert _list_once(private_ca, hold_s=0.5, close_timeout_s=10.0) < 10.0


def test_runtime_aborts_tls_connections_still_closing_after_its_wait(
    private_ca: ServerCertificate,
):
    # The server never ends the TLS shutdown: the runtime aborts the connection after its
    # wait, and neither leaks it nor waits for the shutdown's own timeout (uvloop's 30 s).
    assert _list_once(private_ca, hold_s=60.0, close_timeout_s=0.2) < 10.0


_LIST_ONCE = """
import os, sys, threading, time, warnings
from concurrent_loader import ObjectDataset, runtime
from concurrent_loader.stores import S3Config
warnings.simplefilter("error", ResourceWarning)  # as the test suite runs
errors = []
threading.excepthook = lambda args: errors.append(repr(args.exc_value))
sys.unraisablehook = lambda args: errors.append(repr(args.exc_value))
runtime.CONNECTIONS_CLOSE_TIMEOUT_S = float(sys.argv[2])
lease = runtime.acquire_runtime()  # the listing's own lease is not the last one
ds = ObjectDataset(S3Config.from_url(
    "s3://bkt/", endpoint_url=sys.argv[1], anonymous=True, ca_bundle=os.environ["CA_BUNDLE"]
))
start = time.monotonic()
lease.release()  # the last lease: the runtime closes
took = time.monotonic() - start
print("unclosed transports, errors closing the loop:", errors)
print("closed in", took)
print("listed", list(ds.keys))
sys.exit(1 if errors else 0)
"""
