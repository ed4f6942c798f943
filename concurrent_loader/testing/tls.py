"""HTTPS on loopback for the tests: a private CA made at test time, and a TLS front.

* :func:`make_private_ca` writes a new CA and a server certificate it signed for
  ``127.0.0.1`` and ``localhost`` (EC P-256, valid for a day, made with the
  ``cryptography`` package, which ``moto[server]`` brings into the development
  environment). No system trust store holds the CA, so a client refuses the server
  unless it is told to trust :attr:`ServerCertificate.ca_bundle`.
* :class:`TlsFront` terminates TLS with that certificate in front of an ``http://``
  server (the local S3 servers speak plain HTTP) and relays the bytes both ways
  unchanged, so a signed request's ``Host`` header reaches the server as the client
  signed it. It counts the TCP connections it accepted and the TLS handshakes that
  completed or failed, so a test sees how often a client tried.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .background import BackgroundServer, pipe

__all__ = ["ServerCertificate", "TlsFront", "make_private_ca"]

_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class ServerCertificate:
    """PEM files of a server certificate and of the CA that signed it."""

    #: the CA's certificate: what a client must trust
    ca_bundle: Path
    #: the server's certificate, then the CA's
    cert_chain: Path
    #: the server's private key
    key: Path
    #: the names and addresses the certificate is valid for
    hosts: tuple[str, ...]

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_chain, self.key)
        return context


def make_private_ca(
    directory: str | Path, hosts: tuple[str, ...] = _HOSTS, *, name: str = "concurrent-loader"
) -> ServerCertificate:
    """Write a new CA and a server certificate for ``hosts`` under ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    # A minute of slack for clocks that disagree by a little.
    not_before, not_after = now - datetime.timedelta(minutes=1), now + datetime.timedelta(days=1)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_bundle, cert_chain, key_file = out / "ca.pem", out / "server.pem", out / "server.key"
    ca_bundle.write_bytes(ca_cert.public_bytes(pem))
    cert_chain.write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ServerCertificate(ca_bundle, cert_chain, key_file, tuple(hosts))


class TlsFront(BackgroundServer):
    """``https://127.0.0.1:port`` in front of the ``http://`` server ``upstream``.

    ``connections`` counts the TCP connections accepted, ``handshakes`` the TLS
    handshakes completed and ``refused`` those that failed (a client that does not trust
    the certificate fails its handshake: one per attempt).
    """

    def __init__(self, upstream: str, certificate: ServerCertificate) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host[:port], got {upstream!r}")
        super().__init__()
        self.upstream = (parts.hostname, parts.port or 80)
        self.certificate = certificate
        self._context = certificate.server_context()
        self.connections = 0
        self.handshakes = 0
        self.refused = 0

    @property
    def endpoint_url(self) -> str:
        return f"https://{self.address}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await writer.start_tls(self._context)
        except (ssl.SSLError, OSError):
            self.refused += 1
            return
        self.handshakes += 1
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.track(up_writer)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
