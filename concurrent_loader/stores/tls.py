"""The trust store for HTTPS backends, built from the fetch configuration."""

from __future__ import annotations

import ssl

from ..config import FetchConfig

__all__ = ["ssl_context_for"]


def ssl_context_for(config: FetchConfig, ca_bundle: str | None = None) -> ssl.SSLContext:
    """The client context: the system's trust store, or ``ca_bundle``'s certificates."""
    context = ssl.create_default_context(cafile=ca_bundle)
    if not config.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
