"""Which faults the proxy injects, and the pure function that picks one for a request.

:class:`FaultPlan` is a frozen, validated value object. :meth:`FaultPlan.fault_for`
depends only on the plan and ``(method, target, n)`` (see :mod:`.draws`), so a test can
predict, in its own process, the fault the proxy will inject. Faults only hit object
requests (``/bucket/key``) whose method is in ``FaultPlan.faults_on`` (``GET`` by
default); bucket listings and uploads always pass.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .draws import is_object_target, uniforms

__all__ = ["FAULT_NAMES", "FaultPlan"]

#: Every fault a plan can inject, in the order the single uniform draw is partitioned.
FAULT_NAMES: tuple[str, ...] = (
    "slowdown_503",
    "error_500",
    "reset_before",
    "reset_mid_body",
    "truncate",
    "stall",
    "slow",
    "corrupt",
    "stray_bytes",
    "ignore_range",
)


@dataclass(frozen=True)
class FaultPlan:
    """Which faults to inject and how often; all rates are probabilities per request.

    The rates partition one uniform draw, so at most one fault hits a request and their
    sum must not exceed 1. ``slow`` delays the first byte by ``extra_latency_ms`` on top
    of the proxy's latency; ``stall`` sends the response head, then nothing for
    ``stall_seconds``, then closes. ``corrupt`` inverts one byte of a ``2xx`` body that has
    a ``Content-Length`` (others pass unchanged), ``stray_bytes`` sends a second, unasked
    response after a complete one on the same open connection (:mod:`.tamper`).

    A **SlowDown storm** (``storm_seconds > 0``) is scripted in time, not drawn: every
    faultable request that arrives from ``storm_start_s`` to ``storm_start_s +
    storm_seconds`` after the proxy's first faultable request (since it started or was
    reset) is answered 503 SlowDown, whatever the draw says (:meth:`in_storm`).

    A throttle's answer carries ``throttle_code`` as its XML ``<Code>`` (``ServerBusy`` makes
    it Azure's) and, when ``retry_after_s > 0``, a ``Retry-After`` header.
    """

    seed: int = 0
    slowdown_503: float = 0.0
    error_500: float = 0.0
    reset_before: float = 0.0
    reset_mid_body: float = 0.0
    truncate: float = 0.0
    stall: float = 0.0
    slow: float = 0.0
    corrupt: float = 0.0
    stray_bytes: float = 0.0
    ignore_range: float = 0.0
    stall_seconds: float = 30.0
    extra_latency_ms: float = 0.0
    storm_start_s: float = 0.0
    storm_seconds: float = 0.0
    #: seconds a 503 answer asks the client to wait, in a ``Retry-After`` header (0: none)
    retry_after_s: float = 0.0
    faults_on: tuple[str, ...] = ("GET",)
    #: the error code of a 503 answer's body (S3's ``SlowDown``; Azure's ``ServerBusy``)
    throttle_code: str = "SlowDown"

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        total = 0.0
        for name in FAULT_NAMES:
            rate = getattr(self, name)
            if isinstance(rate, bool) or not isinstance(rate, (int, float)):
                raise ValueError(f"{name} must be a number in [0, 1], got {rate!r}")
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate!r}")
            total += rate
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates must sum to at most 1, got {total:g}")
        if not (isinstance(self.throttle_code, str) and self.throttle_code.isalnum()):
            raise ValueError(
                f"throttle_code must be letters and digits, got {self.throttle_code!r}"
            )
        for name in (
            "stall_seconds",
            "extra_latency_ms",
            "storm_start_s",
            "storm_seconds",
            "retry_after_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.faults_on, str):
            raise ValueError("faults_on must be a sequence of HTTP methods, not a string")
        methods = tuple(str(m).upper() for m in self.faults_on)
        if not all(m.isalpha() for m in methods):
            raise ValueError(f"faults_on must hold HTTP method names, got {self.faults_on!r}")
        # Accept any sequence but store a tuple so the plan stays hashable.
        object.__setattr__(self, "faults_on", methods)

    @property
    def any_faults(self) -> bool:
        return self.storm_seconds > 0.0 or any(getattr(self, name) > 0.0 for name in FAULT_NAMES)

    def faultable(self, method: str, target: str) -> bool:
        """Whether a request ``method target`` may get a fault at all."""
        return method in self.faults_on and is_object_target(target)

    def in_storm(self, seconds: float) -> bool:
        """Whether a faultable request ``seconds`` after the first one falls in the storm."""
        start = self.storm_start_s
        return self.storm_seconds > 0.0 and start <= seconds < start + self.storm_seconds

    def fault_for(self, method: str, target: str, n: int) -> str | None:
        """The fault for the ``n``-th earlier-seen request ``method target``, or None.

        ``target`` is the request target as sent (path and query). Pure: the same
        arguments give the same answer in any process.
        """
        if not self.faultable(method, target):
            return None
        draw, _ = uniforms(self.seed, method, target, n)
        cumulative = 0.0
        for name in FAULT_NAMES:
            cumulative += getattr(self, name)
            if draw < cumulative:
                return name
        return None

    def to_cli_args(self) -> list[str]:
        """The command-line flags of the proxy process that reproduce this plan."""
        args = ["--seed", str(self.seed)]
        for field in dataclasses.fields(self):
            if field.name in ("seed", "faults_on"):
                continue
            value = getattr(self, field.name)
            text = value if isinstance(value, str) else repr(float(value))
            args += ["--" + field.name.replace("_", "-"), text]
        args += ["--faults-on", ",".join(self.faults_on)]
        return args
