"""The proxy's only source of randomness: uniform draws keyed by the request.

Every random choice the proxy makes for a request (a fault, a jitter, ...) comes from
:func:`uniforms`, a pure function of ``(seed, method, target, n)`` where ``n`` counts
the earlier requests with the same method and target. The same request sequence
therefore gets the same draws in any process and whatever the interleaving across keys,
and a retried request gets a fresh but reproducible draw.
"""

from __future__ import annotations

import hashlib

__all__ = ["is_object_target", "uniforms"]


def uniforms(seed: int, method: str, target: str, n: int) -> tuple[float, float]:
    """Two independent uniforms in [0, 1) for one request: (fault draw, jitter draw)."""
    digest = hashlib.blake2b(
        f"{seed}\x00{method}\x00{target}\x00{n}".encode(), digest_size=16
    ).digest()
    return (
        int.from_bytes(digest[:8], "big") / 2.0**64,
        int.from_bytes(digest[8:], "big") / 2.0**64,
    )


def is_object_target(target: str) -> bool:
    """True for a path-style object request target (``/bucket/key...``)."""
    path = target.split("?", 1)[0]
    bucket, _, key = path.lstrip("/").partition("/")
    return bool(bucket) and bool(key) and not path.startswith("/__proxy__/")
