"""What every transport returns: one HTTP response, read to the end."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Response"]


@dataclass(slots=True)
class Response:
    """One HTTP response, read to the end. ``headers`` names are lower-case; repeated
    headers are joined with ``", "``. The caller owns ``body`` (the transport keeps no
    reference to it, so a ``bytearray`` body may be resized in place)."""

    status: int
    headers: dict[str, str]
    body: bytearray | bytes
    #: seconds from the request's send to the first byte of the response, when measured
    first_byte_s: float | None = None
