"""The latency model: how long the proxy holds each response's first byte.

A :class:`LatencyModel` is a frozen, validated value object with one of two first-byte
latencies, plus stragglers:

* **fixed** (the default): ``latency_ms``, moved by a uniform ``+- jitter_ms``;
* **lognormal**: given ``latency_p50_ms`` and ``latency_p99_ms``, the latency ``L`` has
  ``ln L ~ N(mu, sigma)`` with ``mu = ln p50`` and ``sigma = ln(p99 / p50) / z(0.99)``,
  so that half the requests wait less than p50 and 99 % less than p99. The tail above
  p99 is the lognormal's own (for p50 30 ms and p99 200 ms, about 1 in 10^7 requests
  waits over 2 s);
* **stragglers**: a fraction ``straggler_fraction`` of object GETs (``GET /bucket/key``)
  wait ``straggler_s`` seconds more, whatever the rest of the model drew.

Combining a fixed latency with a lognormal one raises ValueError: they are two answers to
the same question. Named presets (:data:`LATENCY_PRESETS`) give realistic starting
points; :meth:`LatencyModel.from_options` applies a preset, then every option given.

Reproducibility: :meth:`LatencyModel.first_byte` is a pure function of ``(seed, method,
target, n)`` (see :mod:`.draws`). The fixed model's jitter uses the same draw as it always
has; the lognormal and straggler draws come from a stream of their own, so they change
neither the jitter nor any fault. The proxy passes ``FaultPlan.seed`` as the seed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from types import MappingProxyType
from typing import Any

from .draws import is_object_target, latency_uniforms, uniforms

__all__ = ["LATENCY_PRESETS", "LatencyModel"]

_Z99 = NormalDist().inv_cdf(0.99)


def _check_non_negative(name: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class LatencyModel:
    """First-byte latency (fixed or lognormal) and stragglers; see the module docstring.

    ``first_byte`` gives, for one request, the seconds from the arrival of its head to
    its first response byte, and whether it straggles.
    """

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    straggler_fraction: float = 0.0
    straggler_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("latency_ms", "jitter_ms", "straggler_s"):
            _check_non_negative(name, getattr(self, name))
        _check_non_negative("straggler_fraction", self.straggler_fraction)
        if self.straggler_fraction > 1:
            raise ValueError(f"straggler_fraction must be in [0, 1], got {self.straggler_fraction}")
        p50, p99 = self.latency_p50_ms, self.latency_p99_ms
        if (p50 is None) != (p99 is None):
            raise ValueError("latency_p50_ms and latency_p99_ms go together: give both or neither")
        if p50 is not None and p99 is not None:
            _check_non_negative("latency_p50_ms", p50)
            _check_non_negative("latency_p99_ms", p99)
            if not 0 < p50 <= p99:
                raise ValueError(
                    f"need 0 < latency_p50_ms <= latency_p99_ms, got {p50!r} and {p99!r}"
                )
            if self.latency_ms or self.jitter_ms:
                raise ValueError(
                    "latency_ms/jitter_ms (fixed) and latency_p50_ms/latency_p99_ms "
                    "(lognormal) are two latency models: give one"
                )

    @classmethod
    def from_options(cls, preset: str | None = None, **options: float | None) -> LatencyModel:
        """The preset's model (or the default one), with every option that is not None.

        ValueError for an unknown preset or an invalid result; TypeError for an unknown
        option name.
        """
        if preset is None:
            base = cls()
        elif preset in LATENCY_PRESETS:
            base = LATENCY_PRESETS[preset]
        else:
            raise ValueError(f"unknown preset {preset!r}; known: {sorted(LATENCY_PRESETS)}")
        return dataclasses.replace(base, **{k: v for k, v in options.items() if v is not None})

    @property
    def lognormal(self) -> bool:
        return self.latency_p50_ms is not None

    @property
    def draws_per_request(self) -> bool:
        """Whether any request's latency depends on a random draw."""
        return self.jitter_ms > 0 or self.lognormal or self.straggler_fraction > 0

    def first_byte(self, seed: int, method: str, target: str, n: int) -> tuple[float, bool]:
        """(delay in seconds, whether a straggler) for the ``n``-th request ``method target``.

        Pure: the same arguments give the same answer in any process. With the fixed model
        the delay may be below zero (``jitter_ms > latency_ms``); the proxy adds any extra
        a fault asks for, then waits for the sum or not at all.
        """
        random_stream = self.lognormal or self.straggler_fraction > 0
        latency_draw, straggler_draw = (
            latency_uniforms(seed, method, target, n) if random_stream else (0.5, 1.0)
        )
        if self.latency_p50_ms is not None and self.latency_p99_ms is not None:
            sigma = math.log(self.latency_p99_ms / self.latency_p50_ms) / _Z99
            z = NormalDist().inv_cdf(latency_draw)
            delay = self.latency_p50_ms * math.exp(sigma * z) / 1000.0
        else:
            delay = self.latency_ms / 1000.0
            if self.jitter_ms > 0:
                _, jitter_draw = uniforms(seed, method, target, n)
                delay += self.jitter_ms / 1000.0 * (2.0 * jitter_draw - 1.0)
        straggler = (
            straggler_draw < self.straggler_fraction
            and method == "GET"
            and is_object_target(target)
        )
        if straggler:
            delay += self.straggler_s
        return delay, straggler

    def to_cli_args(self) -> list[str]:
        """The command-line flags of the proxy process that reproduce this model."""
        args = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                args += ["--" + field.name.replace("_", "-"), repr(float(value))]
        return args


#: Named starting points for :meth:`LatencyModel.from_options`. ``s3-like``: a first byte
#: after 30 ms at the median and 200 ms at p99, and 0.5 % of object GETs 2 s late.
LATENCY_PRESETS: MappingProxyType[str, LatencyModel] = MappingProxyType(
    {
        "s3-like": LatencyModel(
            latency_p50_ms=30.0,
            latency_p99_ms=200.0,
            straggler_fraction=0.005,
            straggler_s=2.0,
        ),
    }
)
