"""moto's S3 server on localhost: a second, independent S3 implementation for the tests.

:class:`MotoS3Server` runs ``python -m moto.server`` (from ``moto[server]``) as a child
process, the way :class:`~.server.LocalS3Server` runs SeaweedFS, with the same helpers:

* bound to 127.0.0.1, on a free port below the ephemeral range;
* with authentication enforced, which moto leaves off by default: once it answers, an IAM
  user ``admin`` with an allow-everything policy and a role ``loader`` it may assume are
  created, and from then on every request must carry a valid SigV4 signature of a known
  key (and, for an assumed role's key, its session token), or it gets 403. The admin's
  keys come from moto's IAM, so :attr:`~MotoS3Server.access_key` and
  :meth:`~MotoS3Server.env` are valid only once the server started;
* :meth:`~MotoS3Server.temporary_credentials` assumes ``loader`` through moto's STS;
* everything lives in the server's memory: nothing survives ``stop()``.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

from .ports import free_port, release_ports
from .s3process import S3ServerProcess, TemporaryCredentials

__all__ = ["MotoS3Server"]

# moto's default account.
_ACCOUNT = "123456789012"
_ROLE = "loader"
_ALLOW_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)
_TRUST_ADMIN = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{_ACCOUNT}:user/admin"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
)


class MotoS3Server(S3ServerProcess):
    """One moto server process serving S3 (and IAM and STS) on ``127.0.0.1``."""

    name = "moto"

    def __init__(self, *, startup_timeout_s: float = 60.0) -> None:
        super().__init__(startup_timeout_s=startup_timeout_s)
        self._port = free_port()
        # Until IAM issues the admin's keys: moto accepts any before auth is enforced.
        self._access_key = "AKIABOOTSTRAP0000000"
        self._secret_key = "bootstrap"
        self._keys_issued = False

    @property
    def port(self) -> int:
        return self._port

    @property
    def access_key(self) -> str:
        self._check_keys()
        return self._access_key

    @property
    def secret_key(self) -> str:
        self._check_keys()
        return self._secret_key

    def _check_keys(self) -> None:
        if not self._keys_issued and not self._started:
            raise RuntimeError("a MotoS3Server's keys exist only once it started")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._port)]

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The server must not pick up this process's AWS settings, nor its own port from
        # a caller's moto setup.
        for name in list(env):
            if name.startswith(("AWS_", "MOTO_")):
                del env[name]
        return env

    def _ready(self) -> None:
        iam = self.client("iam")
        try:
            iam.create_user(UserName="admin")
            iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=_ALLOW_ALL)
            keys = iam.create_access_key(UserName="admin")["AccessKey"]
            iam.create_role(RoleName=_ROLE, AssumeRolePolicyDocument=_TRUST_ADMIN)
            iam.put_role_policy(RoleName=_ROLE, PolicyName="all", PolicyDocument=_ALLOW_ALL)
        finally:
            iam.close()
        self._access_key, self._secret_key = keys["AccessKeyId"], keys["SecretAccessKey"]
        self._keys_issued = True
        # From the next request on, every request is authenticated and authorized.
        request = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/reset-auth",
            data=b"0",
            # Not urllib's default form type: moto reads the raw body, which a form is not.
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def temporary_credentials(self) -> TemporaryCredentials:
        """A session of the role ``loader`` (allowed everything), from moto's STS."""
        sts = self.client("sts")
        try:
            issued = sts.assume_role(
                RoleArn=f"arn:aws:iam::{_ACCOUNT}:role/{_ROLE}",
                RoleSessionName="concurrent-loader",
            )["Credentials"]
        finally:
            sts.close()
        return TemporaryCredentials(
            issued["AccessKeyId"], issued["SecretAccessKey"], issued["SessionToken"]
        )

    def _cleanup(self) -> None:
        release_ports([self._port])
