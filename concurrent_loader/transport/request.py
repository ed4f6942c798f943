"""The bytes of one HTTP/1.1 GET, refused (``ConfigError``) if any part could break its framing;
``Host`` comes from the :class:`~.origin.Origin` only (a caller's own is refused).
"""

from __future__ import annotations

from collections.abc import Sequence

from concurrent_loader.errors import ConfigError

__all__ = ["build_request", "range_value"]


def range_value(byte_range: tuple[int, int]) -> str:
    """The ``Range`` header value for ``(start, end)``, ``end`` exclusive."""
    start, end = byte_range
    if (
        isinstance(start, bool)
        or isinstance(end, bool)
        or not isinstance(start, int)
        or not isinstance(end, int)
        or not 0 <= start < end
    ):
        raise ConfigError(
            f"byte_range must be (start, end) with 0 <= start < end, got {byte_range!r}"
        )
    return f"bytes={start}-{end - 1}"


def build_request(
    target: str,
    host_header: str,
    headers: Sequence[tuple[str, str]],
    byte_range: tuple[int, int] | None = None,
    *,
    absolute_prefix: str = "",
) -> bytes:
    """``GET target`` with ``Host: host_header``, ``headers`` and, for ``byte_range``, a
    ``Range`` header. ``absolute_prefix`` (``http://host``) puts the target in absolute
    form, as a request to a forward proxy needs."""
    parts = ["GET ", absolute_prefix, target, " HTTP/1.1\r\nHost: ", host_header, "\r\n"]
    for name, value in headers:
        if len(name) == 4 and name.lower() == "host":
            raise ConfigError("pass no Host header: the transport sends the origin's own")
        parts += (name, ": ", value, "\r\n")
    lines = len(headers) + 3  # the request line, Host, the blank line
    if byte_range is not None:
        parts += ("Range: ", range_value(byte_range), "\r\n")
        lines += 1
    parts.append("\r\n")
    text = "".join(parts)
    # One CR and one LF per line written; any other could inject headers.
    if (
        text.count("\n") != lines
        or text.count("\r") != lines
        or " " in target
        or not target.startswith("/")
    ):
        raise ConfigError(f"invalid request target or header value for {target[:100]!r}")
    try:
        return text.encode("ascii")
    except UnicodeEncodeError as exc:
        raise ConfigError("request target and headers must be ASCII (URI-encode the path)") from exc
