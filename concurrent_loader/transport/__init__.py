"""HTTP clients for the GET of every object: HTTP only, nothing about any store. The transport,
:class:`ConnectionPool` (HTTP/1.1, over TCP or TLS, through a :class:`Proxy`), sends ``GET
target`` to an :class:`Origin` and returns the :class:`Response` read to the end. It
guarantees:

* it writes ``Host`` itself (:attr:`Origin.host_header`, what a signer signs); a caller's
  ``Host``, or a target or header value that could break framing, is a ``ConfigError``;
* at most ``max_connections`` connections at once; waiters are woken FIFO, never polled;
* a connection is reused only after its response was read to the end, the server did not
  ask to close it, and no byte arrived past that response up to the next request's write;
* only the ``chunked`` transfer coding (others: ``UNSUPPORTED_ENCODING``, not retried); no
  content coding is asked for or decoded;
* ``max_bytes`` bounds the body, checked against ``Content-Length`` before any body byte;
* ``byte_range=(start, end)`` (``end`` exclusive) succeeds only as that exact range (a
  matching ``206``, or a ``200`` whose ``Content-Range``, or ``Content-Length`` for a range
  from byte 0, shows it is the range; another range or length is ``MALFORMED_RESPONSE``);
  any other ``200`` (the whole object, perhaps) is refused (``BadRequest``) and its
  connection closed before a body byte is read;
* ``digest_for(status, headers)``, called once the final head is read, may return a
  :class:`BodyDigest` of its own: it is fed every body byte (after framing), in order,
  exactly once, as the bytes arrive, and comes back as :attr:`Response.digest`;
* failures raise the :mod:`concurrent_loader.errors` tree with ``stage="fetch"``, ``url``
  (a label, without credentials) and a ``Reason``; non-2xx statuses are returned;
* a cancelled ``get`` leaves no half-read connection to reuse; ``close()`` closes every
  socket before it returns; ``get`` after it raises ``RuntimeError``.
"""

from __future__ import annotations

from .origin import Origin
from .pool import ConnectionPool
from .proxy import Proxy
from .reader import BodyDigest, DigestFor, Response

__all__ = ["BodyDigest", "ConnectionPool", "DigestFor", "Origin", "Proxy", "Response"]
