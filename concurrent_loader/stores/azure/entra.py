"""Entra ID (Azure AD) bearer tokens for one store, from ``azure-identity`` (the ``azure``
extra): ``DefaultAzureCredential`` unless a credential object is given.

A token is fetched off the event loop (the credential's ``get_token`` blocks: it may call a
metadata endpoint or run the Azure CLI), once for all the GETs that need it at that moment,
and fetched again :data:`REFRESH_BEFORE_EXPIRY_S` before it expires: GETs go on with the
old token while that refresh runs, and wait for it only once the old one is about to
expire. The token never appears in a repr, a log or an error.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from ...errors import AccessDenied, ConfigError, Reason

__all__ = ["SCOPE", "EntraTokens", "default_credential"]

#: the OAuth scope of Azure Storage
SCOPE = "https://storage.azure.com/.default"
#: seconds before expiry when a token is fetched again
REFRESH_BEFORE_EXPIRY_S = 300.0
#: seconds before expiry when a token is no longer sent (GETs wait for the new one)
USABLE_UNTIL_EXPIRY_S = 30.0
#: seconds after a failed refresh before the next, while the token in hand is still usable
RETRY_REFRESH_AFTER_S = 10.0

logger = logging.getLogger(__name__)


def default_credential(url: str) -> Any:
    """``azure.identity.DefaultAzureCredential()``, or a ``ConfigError`` saying how to get it."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigError(
            "no Azure account key, SAS token or connection string found "
            "(AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN), and "
            "Entra ID sign-in needs azure-identity: pip install 'concurrent-loader[azure]'",
            url=url,
        ) from None
    return DefaultAzureCredential()


class EntraTokens:
    """The current bearer token of ``credential`` (an ``azure.core`` ``TokenCredential``)."""

    def __init__(self, credential: Any, url: str) -> None:
        self._credential = credential
        self._url = url
        self._token = ""
        self._expires_at = -math.inf
        self._refresh_at = -math.inf
        self._pending: asyncio.Future[Any] | None = None

    def __repr__(self) -> str:
        return f"EntraTokens(for {self._url})"

    def refresh_due(self) -> bool:
        """Whether the token is missing or near its expiry (one clock read)."""
        return time.time() >= self._refresh_at

    async def refresh(self) -> None:
        """Start fetching a new token (one fetch for every caller); wait for it only when
        the current one is missing or about to expire."""
        usable = time.time() < self._expires_at - USABLE_UNTIL_EXPIRY_S
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = loop.run_in_executor(None, self._fetch)
            self._pending.add_done_callback(self._fetched)
        if not usable:
            await asyncio.shield(self._pending)

    def _fetch(self) -> Any:
        """On an executor thread: the credential's new ``AccessToken``."""
        try:
            return self._credential.get_token(SCOPE)
        except Exception as exc:
            # The credential's own message says which sources it tried; it holds no secret.
            raise AccessDenied(
                f"no Entra ID token for Azure Storage: {type(exc).__name__}: {exc}",
                url=self._url,
                stage="fetch",
                cause=Reason.NO_CREDENTIALS,
            ) from exc

    def _fetched(self, future: asyncio.Future[Any]) -> None:
        """On the loop's thread, before any waiter resumes: keep the new token."""
        self._pending = None
        if future.cancelled():
            return
        if future.exception() is None:
            token = future.result()
            self._token, self._expires_at = token.token, float(token.expires_on)
            self._refresh_at = self._expires_at - REFRESH_BEFORE_EXPIRY_S
        else:
            # Retrieved here, so a background refresh that failed is logged, not lost; a
            # caller waiting on it gets the error itself. The next try waits a while, as
            # long as the token in hand lasts.
            logger.debug("refreshing the Entra ID token for %s failed", self._url)
            self._refresh_at = min(
                time.time() + RETRY_REFRESH_AFTER_S, self._expires_at - USABLE_UNTIL_EXPIRY_S
            )

    def headers(self) -> list[tuple[str, str]]:
        return [("Authorization", "Bearer " + self._token)]

    def close(self) -> None:
        close = getattr(self._credential, "close", None)
        if close is not None:
            close()
