"""An HTTP/1.1 reverse proxy that makes a local S3 server behave like a remote one.

It sits between a client and a real S3-compatible server (see
:class:`~concurrent_loader.testing.server.LocalS3Server`) and adds what a laptop-local
server lacks: time to first byte (fixed, ``latency_ms`` +- ``jitter_ms``, or lognormal
from ``latency_p50_ms`` and ``latency_p99_ms``), stragglers, bandwidth caps per
connection and in total, and injected faults (503 SlowDown, 500, connection resets before
or in the middle of a body, truncated bodies, stalls, extra slow responses, a body with one
byte inverted, a stray response after a complete one, a range ignored). The
``"s3-like"`` preset gives a first byte after 30 ms at the median and 200 ms at p99, and
makes 0.5 % of object GETs 2 s late.

Guarantees:

* Requests are forwarded unchanged (request line, ``Host`` and ``Authorization`` headers
  included), so SigV4 signatures computed for the proxy's address stay valid upstream.
  Only hop-by-hop headers (``Connection``, ``Keep-Alive``, ``Expect``...) are rewritten.
* Whether a request gets a fault, and how long its first byte waits, are pure functions
  of ``(seed, method, path with query, n)``, where ``n`` counts the earlier requests
  with the same method and path. The same request sequence therefore sees the same faults
  and latencies, whatever the interleaving across keys, and a retried request gets a
  fresh but reproducible draw. Faults only hit object requests (``/bucket/key``) whose
  method is in ``FaultPlan.faults_on`` (``GET`` by default), stragglers only object
  GETs; bucket listings and uploads always pass.
* Latency is measured from the arrival of the request head to the first response byte,
  so the upstream's own time is hidden inside it rather than added to it.
* The bytes sent to clients by time ``t`` stay within each cap's ``rate * t``, plus
  about 21 ms of the cap per connection (see :mod:`.bandwidth`).
* Counters are served at ``GET /__proxy__/stats`` (JSON) and cleared, together with the
  per-request history behind ``n``, by ``POST /__proxy__/reset``. Neither is forwarded.

The modules, by concern: :mod:`.draws` (the seeded per-request draws), :mod:`.faults`
(:class:`FaultPlan`), :mod:`.tamper` (corrupted bodies, stray bytes), :mod:`.latency`
(:class:`LatencyModel`), :mod:`.bandwidth` (the token buckets), :mod:`.http` (heads and
body relays), :mod:`.connections` (the client and upstream sockets), :mod:`.stats`,
:mod:`.server` (:class:`ProxyServer`), :mod:`.cli` (the proxy process) and
:mod:`.process` (:class:`ProxyProcess`, which starts and stops it).

The proxy runs as its own process (``python -m concurrent_loader.testing.proxy --help``)
so that its CPU time can be measured and pinned apart from the code under test. All but
:mod:`.process` import only the standard library (plus ``uvloop`` when installed) and each
other, because the proxy process imports them without the rest of the package; names
here are therefore imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..subprocesses import process_cpu_seconds
    from .cli import main
    from .faults import FAULT_NAMES, FaultPlan
    from .latency import LATENCY_PRESETS, LatencyModel
    from .process import ProxyProcess
    from .server import ProxyServer

__all__ = [
    "FAULT_NAMES",
    "LATENCY_PRESETS",
    "FaultPlan",
    "LatencyModel",
    "ProxyProcess",
    "ProxyServer",
    "main",
    "process_cpu_seconds",
]

_HOME = {
    "FAULT_NAMES": ".faults",
    "FaultPlan": ".faults",
    "LATENCY_PRESETS": ".latency",
    "LatencyModel": ".latency",
    "ProxyProcess": ".process",
    "ProxyServer": ".server",
    "main": ".cli",
    "process_cpu_seconds": "..subprocesses",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
