"""Where GETs for a bucket go: resolved once, by botocore's own machinery, never re-derived.

:func:`resolve_route` builds a botocore S3 client as listing does and captures a prepared
``GetObject`` before it is sent: its URL gives the origin and the path in front of the key.
Proxies and the trust store follow botocore too. The route holds no credential; its repr
hides a proxy's user and password.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...errors import ConfigError
from ...transport import Origin

__all__ = ["S3Route", "resolve_route"]

_PROBE_KEY = "k"


class _Captured(Exception):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


@dataclass(frozen=True)
class S3Route:
    """The resolved destination of one bucket's GETs."""

    origin: Origin
    #: the URI-encoded path in front of the URI-encoded key (``/bucket/``, ``/``, ``/s3/bucket/``)
    path_prefix: str
    region: str
    #: the proxy every GET goes through, or None
    proxy: str | None = field(default=None, repr=False)
    #: a CA bundle path, or None for the system's trust store
    ca_bundle: str | None = None

    def __repr__(self) -> str:
        proxy = _hide_userinfo(self.proxy) if self.proxy else None
        return (
            f"S3Route({self.origin.scheme}://{self.origin.host_header}{self.path_prefix}, "
            f"region={self.region!r}, proxy={proxy!r}, ca_bundle={self.ca_bundle!r})"
        )


def resolve_route(
    bucket: str,
    session: Any,
    *,
    endpoint_url: str | None,
    region: str | None,
    addressing_style: str | None,
    ca_bundle: str | None,
    url: str,
) -> S3Route:
    """The route botocore would use for ``GetObject`` on ``bucket`` from ``session``."""
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError
    from botocore.utils import get_environ_proxies

    try:
        client = session.create_client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=Config(
                signature_version=UNSIGNED,
                s3={"addressing_style": addressing_style} if addressing_style else None,
            ),
        )
    except (BotoCoreError, ValueError) as exc:
        raise ConfigError(f"cannot configure S3: {exc}", url=url) from exc

    def capture(request: Any, **_: Any) -> None:
        raise _Captured(request.url)

    client.meta.events.register_first("before-send.s3.GetObject", capture)
    request_url = ""
    try:
        client.get_object(Bucket=bucket, Key=_PROBE_KEY)
    except _Captured as captured:
        request_url = captured.url
    except (BotoCoreError, ValueError) as exc:  # e.g. an invalid bucket name
        raise ConfigError(str(exc), url=url) from exc
    finally:
        client.close()

    parts = urlsplit(request_url)
    if not parts.path.endswith("/" + _PROBE_KEY):
        raise RuntimeError(f"unexpected GetObject URL shape from botocore: {parts.path!r}")
    origin = Origin.from_url(f"{parts.scheme}://{parts.netloc}")
    proxies = client.meta.config.proxies or get_environ_proxies(client.meta.endpoint_url)
    return S3Route(
        origin=origin,
        path_prefix=parts.path[: -len(_PROBE_KEY)],
        region=client.meta.region_name,
        proxy=proxies.get(parts.scheme),
        ca_bundle=ca_bundle or _configured_ca_bundle(session),
    )


def _configured_ca_bundle(session: Any) -> str | None:
    value = session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE")
    return value if isinstance(value, str) and value else None


def _hide_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()
