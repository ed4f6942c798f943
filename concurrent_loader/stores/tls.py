"""The trust store for HTTPS backends, built from the fetch configuration."""

from __future__ import annotations

import ssl

from ..config import FetchConfig

__all__ = ["ssl_context_for"]


def ssl_context_for(config: FetchConfig) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if not config.verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
