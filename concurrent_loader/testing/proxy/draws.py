"""The proxy's only source of randomness: uniform draws keyed by the request.

Every random choice the proxy makes for a request (a fault, a jitter, a lognormal
latency, a straggler) comes from this module, as a pure function of ``(seed, method,
target, n)`` where ``n`` counts the earlier requests with the same method and target.
The same request sequence therefore gets the same draws in any process and whatever the
interleaving across keys, and a retried request gets a fresh but reproducible draw.

Draws come in named streams (:func:`uniforms` is the first, used for faults and jitter;
:func:`latency_uniforms` the second), each hashed with its own BLAKE2 personalisation:
the streams are independent, and adding one never changes the draws of another.
"""

from __future__ import annotations

import hashlib

__all__ = ["is_object_target", "latency_uniforms", "uniforms"]


def _digest(seed: int, method: str, target: str, n: int, stream: bytes) -> bytes:
    key = f"{seed}\x00{method}\x00{target}\x00{n}".encode()
    return hashlib.blake2b(key, digest_size=16, person=stream).digest()


def uniforms(seed: int, method: str, target: str, n: int) -> tuple[float, float]:
    """Two independent uniforms in [0, 1) for one request: (fault draw, jitter draw)."""
    digest = _digest(seed, method, target, n, b"")
    return (
        int.from_bytes(digest[:8], "big") / 2.0**64,
        int.from_bytes(digest[8:], "big") / 2.0**64,
    )


def latency_uniforms(seed: int, method: str, target: str, n: int) -> tuple[float, float]:
    """Two independent uniforms in (0, 1) for one request: (latency draw, straggler draw).

    Never exactly 0 or 1, so either can go through an inverse CDF.
    """
    digest = _digest(seed, method, target, n, b"latency")
    # 53 bits, the precision of a float, centred in their interval: strictly inside (0, 1).
    return (
        ((int.from_bytes(digest[:8], "big") >> 11) + 0.5) / 2.0**53,
        ((int.from_bytes(digest[8:], "big") >> 11) + 0.5) / 2.0**53,
    )


def is_object_target(target: str) -> bool:
    """True for a path-style object request target (``/bucket/key...``)."""
    path = target.split("?", 1)[0]
    bucket, _, key = path.lstrip("/").partition("/")
    return bool(bucket) and bool(key) and not path.startswith("/__proxy__/")
