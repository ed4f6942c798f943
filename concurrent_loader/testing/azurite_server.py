"""Azurite, the Azure Storage emulator, as a child process on 127.0.0.1 for the tests.

:class:`AzuriteServer` runs ``azurite-blob`` (the npm package ``azurite``, installed by
``scripts/setup.sh`` under ``.bench/node``) on a free port with its data in a temporary
directory and its telemetry off (no request leaves the machine), with Shared Key and SAS
authentication as the service has them (the well-known development account
``devstoreaccount1``). ``start()`` returns once an authenticated request
succeeds; ``stop()`` is idempotent and removes the data. Filling it uses the official
``azure-storage-blob`` SDK, an independent client.

Given a :class:`~.tls.ServerCertificate`, it serves HTTPS and accepts Entra ID bearer
tokens too (``--oauth basic``: Azurite checks a token's issuer, audience and lifetime, not
its signature), which :class:`EmulatorTokenCredential` issues.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, NamedTuple, Self
from urllib.parse import urlsplit

from ..stores.azure.credentials import AZURITE_ACCOUNT, AZURITE_KEY
from ..stores.azure.store import AzureConfig
from .ports import free_port, release_ports
from .subprocesses import ChildProcess, tail_of, terminate_process
from .tls import ServerCertificate

__all__ = ["AccessToken", "AzuriteServer", "EmulatorTokenCredential", "find_azurite"]

_STOP_GRACE_S = 5.0
_LOCAL_BIN = Path(__file__).resolve().parents[2] / ".bench/node/node_modules/.bin/azurite-blob"


def find_azurite() -> str | None:
    """The ``azurite-blob`` command: ``$AZURITE_BLOB``, the one ``scripts/setup.sh``
    installs under ``.bench/node``, or one on ``PATH``; None when there is none."""
    for candidate in (os.environ.get("AZURITE_BLOB"), str(_LOCAL_BIN)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("azurite-blob")


class AccessToken(NamedTuple):
    """What ``azure.core`` ``TokenCredential.get_token`` returns."""

    token: str
    expires_on: int


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class EmulatorTokenCredential:
    """A ``TokenCredential`` issuing Entra-shaped tokens that Azurite's ``--oauth basic``
    accepts (unsigned: for the emulator only), living ``lifetime_s``; counts its calls."""

    audience = "https://storage.azure.com"
    issuer = "https://sts.windows.net/00000000-0000-0000-0000-000000000000/"

    def __init__(self, lifetime_s: float = 3600.0) -> None:
        self.lifetime_s = lifetime_s
        self.calls = 0

    def get_token(self, *scopes: str, **_: Any) -> AccessToken:
        self.calls += 1
        now = int(time.time())
        expires = int(now + self.lifetime_s)
        claims = {"aud": self.audience, "iss": self.issuer, "iat": now, "nbf": now - 60}
        claims |= {"exp": expires, "oid": "concurrent-loader-tests"}
        header = {"alg": "RS256", "typ": "JWT"}
        parts = (json.dumps(header).encode(), json.dumps(claims).encode(), b"unsigned")
        return AccessToken(".".join(_b64url(part) for part in parts), expires)


class AzuriteServer(ChildProcess):
    """One Azurite blob service on ``127.0.0.1``; it cannot be restarted."""

    account = AZURITE_ACCOUNT
    account_key = AZURITE_KEY

    def __init__(
        self, *, certificate: ServerCertificate | None = None, startup_timeout_s: float = 60.0
    ) -> None:
        self._certificate = certificate
        self._startup_timeout_s = startup_timeout_s
        self._port = free_port()
        self._data: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None
        self._started = self._stopped = False

    @property
    def port(self) -> int:
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("Azurite not started")
        return self._proc.pid

    @property
    def endpoint_url(self) -> str:
        """The blob service's base URL (path-style: the account is its first segment)."""
        scheme = "https" if self._certificate else "http"
        return f"{scheme}://127.0.0.1:{self._port}/{self.account}"

    @property
    def connection_string(self) -> str:
        """The explicit connection string of the development account on this server."""
        return (
            f"DefaultEndpointsProtocol={self.endpoint_url.split(':', 1)[0]};"
            f"AccountName={self.account};"
            f"AccountKey={self.account_key};BlobEndpoint={self.endpoint_url};"
        )

    def env(self) -> dict[str, str]:
        """``AZURE_STORAGE_CONNECTION_STRING`` pointing at this server."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def start(self) -> Self:
        if self._started:
            raise RuntimeError("an AzuriteServer can be started only once")
        self._started = True
        command = find_azurite()
        if command is None:
            raise RuntimeError("azurite-blob is not installed: run scripts/setup.sh")
        self._data = Path(tempfile.mkdtemp(prefix="concurrent-loader-azurite-"))
        tls: list[str] = []
        if self._certificate is not None:
            cert = self._certificate
            tls = ["--cert", str(cert.cert_chain), "--key", str(cert.key), "--oauth", "basic"]
        try:
            self._console = open(self._data / "console.log", "w+b")  # noqa: SIM115
            self._proc = subprocess.Popen(
                [
                    command,
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(self._port),
                    "--location",
                    str(self._data / "data"),
                    "--silent",
                    "--skipApiVersionCheck",
                    "--disableTelemetry",
                    *tls,
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._console,
                stderr=subprocess.STDOUT,
                cwd=self._data,
                start_new_session=True,
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout_s
        delay = 0.05
        # No readiness event exists for an external process: poll, backing off.
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"Azurite exited with status {self._proc.returncode} during startup\n"
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                with self.service_client() as service:
                    service.get_account_information()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Azurite did not answer at {self.endpoint_url} within "
                        f"{self._startup_timeout_s}s\nlog tail:\n{self.log_tail()}"
                    ) from None
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def log_tail(self, max_bytes: int = 4000) -> str:
        return tail_of(self._console, max_bytes) if self._console is not None else ""

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._proc is not None:
            terminate_process(self._proc, grace_s=_STOP_GRACE_S)
        if self._console is not None:
            self._console.close()
            self._console = None
        release_ports([self._port])
        if self._data is not None:
            shutil.rmtree(self._data, ignore_errors=True)

    # -- filling it (azure-storage-blob) ------------------------------------------------

    def service_client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        verify = str(self._certificate.ca_bundle) if self._certificate else True
        return BlobServiceClient.from_connection_string(
            self.connection_string, retry_total=2, connection_timeout=5, connection_verify=verify
        )

    def create_bucket(self, name: str) -> None:
        """Create the container ``name``; no error if it exists."""
        from azure.core.exceptions import ResourceExistsError

        with self.service_client() as service, contextlib.suppress(ResourceExistsError):
            service.create_container(name)

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        """Upload ``data`` as the block blob ``key`` of container ``bucket`` (its MD5 kept)."""
        with self.service_client() as service:
            service.get_blob_client(bucket, key).upload_blob(data, overwrite=True)

    def upload_dir(self, local_dir: str | os.PathLike[str], bucket: str, prefix: str = "") -> int:
        """Upload every file under ``local_dir`` as ``prefix<relative path>``; how many."""
        root = Path(local_dir)
        files = sorted(p for p in root.rglob("*") if p.is_file())
        with self.service_client() as service:
            container = service.get_container_client(bucket)
            for path in files:
                name = prefix + path.relative_to(root).as_posix()
                container.upload_blob(name, path.read_bytes(), overwrite=True)
        return len(files)

    def sas_token(self, container: str, *, hours: float = 1.0) -> str:
        """A container SAS allowing read and list, signed with the account key."""
        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        return str(
            generate_container_sas(
                self.account,
                container,
                account_key=self.account_key,
                permission=ContainerSasPermissions(read=True, list=True),
                expiry=datetime.now(UTC) + timedelta(hours=hours),
            )
        )

    def store_config(
        self, container: str, prefix: str = "", endpoint_url: str | None = None, **options: Any
    ) -> AzureConfig:
        """The config of ``az://container/prefix`` here (Shared Key by default), or through
        ``endpoint_url`` (a proxy in front of this server: its origin alone is enough, the
        account's path is added, as Azurite serves accounts path-style)."""
        if endpoint_url is not None and not urlsplit(endpoint_url).path.strip("/"):
            endpoint_url = f"{endpoint_url.rstrip('/')}/{self.account}"
        if not {"account_key", "sas_token", "connection_string", "anonymous", "credential"} & set(
            options
        ):
            options["account_key"] = self.account_key
        if self._certificate is not None:
            options.setdefault("ca_bundle", str(self._certificate.ca_bundle))
        return AzureConfig.from_url(
            f"az://{container}/{prefix}",
            account_name=self.account,
            endpoint_url=endpoint_url or self.endpoint_url,
            **options,
        )
