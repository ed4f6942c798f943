"""What every S3-compatible server the testing tools run shares.

:class:`S3ServerProcess` is a child process on loopback, started by
:meth:`~S3ServerProcess.start`, which returns once a signed ListBuckets succeeds (or raises
with the tail of the server's log), stopped by :meth:`~S3ServerProcess.stop` (idempotent;
servers still running at interpreter exit are stopped), with boto3 helpers to fill it.
:class:`~.server.LocalS3Server` (SeaweedFS) and :class:`~.moto_server.MotoS3Server` (moto)
are its two implementations.
"""

from __future__ import annotations

import abc
import atexit
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from .subprocesses import ChildProcess, tail_of, terminate_process

__all__ = ["S3ServerProcess", "TemporaryCredentials", "random_key"]

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0

# Strong references: a running server must stay reachable for the exit hook to stop it.
_live_servers: set[S3ServerProcess] = set()


def random_key(length: int, alphabet: str) -> str:
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

    def store_config(
        self, bucket: str, prefix: str = "", endpoint_url: str | None = None, **options: Any
    ) -> Any:
        """The config of ``s3://bucket/prefix`` on this server (or at ``endpoint_url``, a
        proxy in front of it), signed with this server's keys, routes resolved."""
        from ..stores.s3 import S3Config

        return S3Config.from_url(
            f"s3://{bucket}/{prefix}",
            endpoint_url=endpoint_url or self.endpoint_url,
            region=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            **options,
        ).resolved()

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


@atexit.register
def _stop_leftover_servers() -> None:
    # A script that forgot stop() (or died on an exception) must not leave a server running.
    for server in list(_live_servers):
        server.stop()
