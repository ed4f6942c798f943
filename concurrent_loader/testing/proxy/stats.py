"""The proxy's counters, as served at ``GET /__proxy__/stats``.

Request, status and byte counters cover proxied requests only (not the control
endpoints); connection counters include every accepted connection. ``reset()`` zeroes
what a test measures but keeps the gauges (``inflight``, ``client_connections``) true.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .faults import FAULT_NAMES

__all__ = ["Stats"]


class Stats:
    """Plain ints: the proxy's event loop is single-threaded."""

    def __init__(self) -> None:
        self.client_connections = 0
        self.inflight = 0
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.requests_by_method: Counter[str] = Counter()
        self.responses_by_status: Counter[str] = Counter()
        self.faults: Counter[str] = Counter({name: 0 for name in FAULT_NAMES})
        self.stragglers = 0
        self.storm_503 = 0
        self.bytes_sent = 0
        # Requests already in flight stay counted, so max never drops below current.
        self.max_inflight = self.inflight
        self.client_connections_total = 0
        self.upstream_connections_total = 0
        self.upstream_errors = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "requests_by_method": dict(self.requests_by_method),
            "responses_by_status": dict(self.responses_by_status),
            "faults": dict(self.faults),
            "stragglers": self.stragglers,
            "storm_503": self.storm_503,
            "bytes_sent": self.bytes_sent,
            "inflight": self.inflight,
            "max_inflight": self.max_inflight,
            "client_connections": self.client_connections,
            "client_connections_total": self.client_connections_total,
            "upstream_connections_total": self.upstream_connections_total,
            "upstream_errors": self.upstream_errors,
        }
