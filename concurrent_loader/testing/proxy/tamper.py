"""Faults that keep the exchange well framed but change what the client receives.

* ``corrupt``: one byte of a ``2xx`` body with a ``Content-Length`` is inverted in flight
  (the one in its middle), so the length, the framing and the connection stay as they
  were: only a checksum of the body can tell.
* ``stray_bytes``: after a complete response, the proxy sends :data:`STRAY_RESPONSE`, a
  whole second response nobody asked for, on the same connection, which stays open. A
  client that reuses that connection would read it as the answer to its next request.

Standard library only, like the rest of the proxy process.
"""

from __future__ import annotations

from .http import Sink

__all__ = ["STRAY_RESPONSE", "corrupting"]

#: what ``stray_bytes`` sends after a complete response: well-formed, and wrong
STRAY_RESPONSE = b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: "stray"\r\n\r\nstray'


def corrupting(sink: Sink, offset: int) -> Sink:
    """``sink``, with the byte at ``offset`` of the bytes sent through it inverted."""
    sent = 0

    async def send(data: bytes) -> None:
        nonlocal sent
        at = offset - sent
        if 0 <= at < len(data):
            data = data[:at] + bytes((data[at] ^ 0xFF,)) + data[at + 1 :]
        sent += len(data)
        await sink(data)

    return send
