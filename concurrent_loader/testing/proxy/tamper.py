"""Faults that keep the exchange well framed but change what the client receives.

* ``corrupt``: one byte of a ``2xx`` body with a ``Content-Length`` is inverted in flight
  (the one in its middle), so the length, the framing and the connection stay as they
  were: only a checksum of the body can tell.
* ``stray_bytes``: right after a complete response, the proxy sends :data:`STRAY_RESPONSE`,
  a whole second response nobody asked for, on the same connection, which stays open. It
  goes in the same write as the end of a ``Content-Length`` body (:func:`trailing`), so it
  is there when the response ends and before the client could send another request on
  that connection: a client that reuses it anyway reads it as its next answer. (Bytes that
  arrive only after the next request was sent cannot be told from its answer by any
  client; only the object's checksum can.)

Standard library only, like the rest of the proxy process.
"""

from __future__ import annotations

from .http import Sink

__all__ = ["STRAY_RESPONSE", "corrupting", "trailing"]

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


def trailing(sink: Sink, length: int, extra: bytes) -> Sink:
    """``sink``, with ``extra`` sent in the same write as byte ``length`` of the bytes sent
    through it (the last of a body of ``length`` bytes)."""
    sent = 0

    async def send(data: bytes) -> None:
        nonlocal sent
        sent += len(data)
        await sink(data + extra if sent >= length and data else data)

    return send
