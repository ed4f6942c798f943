"""The private CA, the TLS front and the forward proxy, against a small local HTTP server."""

from __future__ import annotations

import http.client
import http.server
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from concurrent_loader.testing import ForwardProxy, ServerCertificate, TlsFront, make_private_ca


class _Handler(http.server.BaseHTTPRequestHandler):
    """``/len/N``: N bytes with a length; ``/chunked/N``: chunked; ``/close/N``: until close."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        kind, _, size = self.path.strip("/").partition("/")
        body = bytes(i % 251 for i in range(int(size or 0)))
        self.send_response(200)
        if kind == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 700):
                piece = body[start : start + 700]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")
        elif kind == "close":
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Host-Seen", self.headers.get("Host", ""))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _body(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


@pytest.fixture
def origin() -> Iterator[str]:
    """``http://127.0.0.1:port`` of a threaded HTTP/1.1 server."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificate:
    return make_private_ca(tmp_path_factory.mktemp("ca"))


def _https(front: TlsFront, cafile: Path | None) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=cafile)
    return http.client.HTTPSConnection("127.0.0.1", front.port, context=context, timeout=10)


def test_private_ca_certifies_loopback_only_for_who_trusts_it(certificate: ServerCertificate):
    assert certificate.hosts == ("127.0.0.1", "localhost")
    assert certificate.key.stat().st_mode & 0o077 == 0
    for pem in (certificate.ca_bundle, certificate.cert_chain):
        assert pem.read_text().startswith("-----BEGIN CERTIFICATE-----")
    # Two certificates in the chain, the CA's last.
    assert certificate.cert_chain.read_text().count("BEGIN CERTIFICATE") == 2
    assert certificate.cert_chain.read_text().endswith(certificate.ca_bundle.read_text())


def test_tls_front_relays_for_a_trusting_client_and_counts(
    origin: str, certificate: ServerCertificate
):
    with TlsFront(origin, certificate) as front:
        assert front.endpoint_url == f"https://127.0.0.1:{front.port}"
        for host in ("127.0.0.1", "localhost"):
            context = ssl.create_default_context(cafile=certificate.ca_bundle)
            conn = http.client.HTTPSConnection(host, front.port, context=context, timeout=10)
            for n in (0, 5, 100_000):  # keep-alive: three requests, one connection
                conn.request("GET", f"/len/{n}")
                response = conn.getresponse()
                assert (response.status, response.read()) == (200, _body(n))
            # The Host header reaches the server as the client sent it.
            assert response.headers["X-Host-Seen"] == f"{host}:{front.port}"
            conn.close()
        conn = _https(front, certificate.ca_bundle)
        conn.request("GET", "/chunked/3000")
        assert conn.getresponse().read() == _body(3000)
        conn.close()
        front.wait_idle()
        assert (front.connections, front.handshakes, front.refused) == (3, 3, 0)


def test_tls_front_is_refused_by_default_once_per_attempt(
    origin: str, certificate: ServerCertificate
):
    with TlsFront(origin, certificate) as front:
        for attempt in (1, 2):
            conn = _https(front, None)
            with pytest.raises(ssl.SSLCertVerificationError):
                conn.request("GET", "/len/1")
            conn.close()
            front.wait_idle()
            assert (front.connections, front.handshakes, front.refused) == (attempt, 0, attempt)


def test_tls_front_arguments_and_lifecycle(origin: str, certificate: ServerCertificate):
    with pytest.raises(ValueError, match="upstream"):
        TlsFront("https://127.0.0.1:1", certificate)
    front = TlsFront(origin, certificate).start()
    conn = _https(front, certificate.ca_bundle)
    conn.request("GET", "/len/10")
    assert conn.getresponse().read() == _body(10)
    front.stop()  # closes the connection that is still open
    front.stop()  # idempotent
    with pytest.raises(RuntimeError, match="only once"):
        front.start()
    conn.close()
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", front.port))


def test_forward_proxy_relays_absolute_form_on_one_connection(origin: str):
    with ForwardProxy() as proxy:
        assert proxy.url == f"http://127.0.0.1:{proxy.port}"
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        paths = ["/len/0", "/len/70000", "/chunked/2500", "/len/3", "/close/4000"]
        for path in paths:
            conn.request("GET", origin + path)
            response = conn.getresponse()
            size = int(path.rsplit("/", 1)[1])
            assert (response.status, response.read()) == (200, _body(size)), path
        conn.close()
        assert proxy.requests == [f"GET {origin}{path} HTTP/1.1" for path in paths]


def test_forward_proxy_tunnels_connect(origin: str, certificate: ServerCertificate):
    with TlsFront(origin, certificate) as front, ForwardProxy() as proxy:
        context = ssl.create_default_context(cafile=certificate.ca_bundle)
        conn = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=context, timeout=10)
        conn.set_tunnel("127.0.0.1", front.port)
        conn.request("GET", "/len/1234")
        assert conn.getresponse().read() == _body(1234)
        conn.close()
        assert proxy.requests == [f"CONNECT 127.0.0.1:{front.port} HTTP/1.0"]
        assert front.handshakes == 1
