"""Google access tokens for one store's GETs, found as Google's client libraries find them.

:class:`TokenSource` loads credentials in the process that uses them (a worker: nothing
resolved is pickled) through google-auth: a credentials factory the config names, a key
file, or Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
file, the metadata server), scoped ``devstorage.read_only``. Loading and refreshing block
(files, the token endpoint), so they run on the loop's executor, one at a time for all the
GETs of the store: a GET in the refresh window (the last quarter of a token's life, at most
:data:`REFRESH_BEFORE_EXPIRY_S`) sends the current token and starts one refresh in the
background; only a GET holding no usable token waits for it. A GET asks the clock once.
The token is never logged or put in a ``repr`` or an error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import UTC
from typing import Any

from .errors import error_for_auth

__all__ = ["READ_ONLY_SCOPE", "TokenSource"]

READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
#: seconds before expiry when a refresh starts (google-auth's own window is 3 min 45 s)
REFRESH_BEFORE_EXPIRY_S = 5 * 60
#: seconds before expiry after which a token is no longer sent (clock skew, time in flight)
STOP_BEFORE_EXPIRY_S = 30.0
#: seconds after a failed refresh before the next is tried (GETs meanwhile get its error)
RETRY_REFRESH_AFTER_S = 1.0

Headers = tuple[tuple[str, str], ...]


def load_credentials(factory: Callable[[], Any] | None, credentials_file: str | None) -> Any:
    """The process's google-auth credentials: ``factory()``, ``credentials_file``, or ADC."""
    import google.auth

    if factory is not None:
        return factory()
    if credentials_file is not None:
        credentials, _ = google.auth.load_credentials_from_file(
            credentials_file, scopes=[READ_ONLY_SCOPE]
        )
        return credentials
    credentials, _ = google.auth.default(scopes=[READ_ONLY_SCOPE])
    return credentials


class TokenSource:
    """The ``Authorization`` header of a store's GETs; use it on one event loop."""

    def __init__(
        self, url: str, factory: Callable[[], Any] | None, credentials_file: str | None
    ) -> None:
        self._url = url
        self._factory = factory
        self._file = credentials_file
        self._credentials: Any = None
        self._header: Headers | None = None  # the Authorization header, alone
        self._refresh_at = -math.inf  # time.time() from which a refresh starts
        self._usable_until = -math.inf  # time.time() until which the header is sent
        self._refreshing: asyncio.Future[None] | None = None
        self._retry_at = -math.inf  # time.time() before which a failed refresh is not retried
        #: refreshes completed (for tests and logs: never the token)
        self.refreshes = 0

    def __repr__(self) -> str:
        return f"TokenSource(for {self._url}, refreshes={self.refreshes})"

    def current(self) -> Headers | None:
        """The headers to send, while no refresh is due (None: await :meth:`headers`)."""
        return self._header if time.time() < self._refresh_at else None

    async def headers(self) -> Headers:
        """The headers to send now: the current token, refreshed when due (once at a time)."""
        now = time.time()
        if now < self._refresh_at:
            return self._header  # type: ignore[return-value]  # set with _refresh_at
        refreshing = self._refreshing
        if refreshing is None or (refreshing.done() and now >= self._retry_at):
            refreshing = self._refreshing = asyncio.ensure_future(self._refresh())
            refreshing.add_done_callback(_retrieve)
        if self._header is not None and now < self._usable_until:
            return self._header
        await asyncio.shield(refreshing)
        if self._header is None:  # pragma: no cover - a refresh either sets it or raises
            raise error_for_auth(RuntimeError("no token"), self._url)
        return self._header

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            token, expires_at, now = await loop.run_in_executor(None, self._refresh_blocking)
        except Exception as exc:
            self._retry_at = time.time() + RETRY_REFRESH_AFTER_S
            raise error_for_auth(exc, self._url) from None  # its text may quote the answer
        life = max(0.0, expires_at - now)
        self._header = (("authorization", f"Bearer {token}"),)
        self._usable_until = expires_at - min(STOP_BEFORE_EXPIRY_S, life / 20)
        self._refresh_at = expires_at - min(REFRESH_BEFORE_EXPIRY_S, life / 4)
        self.refreshes += 1

    def _refresh_blocking(self) -> tuple[str, float, float]:
        """(token, its expiry, now), on the executor."""
        from google.auth.transport.urllib3 import Request
        from urllib3 import PoolManager

        if self._credentials is None:
            self._credentials = load_credentials(self._factory, self._file)
        credentials = self._credentials
        now = time.time()
        # A token loaded with the credentials (or refreshed by their owner) is kept while
        # it has most of its life ahead: only one near expiry, or none, is refreshed.
        if not _fresh(credentials, now):
            with PoolManager(num_pools=1) as http:
                credentials.refresh(Request(http))
        return str(credentials.token), _expires_at(credentials), now


def _expires_at(credentials: Any) -> float:
    """The token's expiry (seconds since the epoch); infinite when it states none."""
    expiry = getattr(credentials, "expiry", None)
    if expiry is None:
        return math.inf
    # google-auth keeps expiries as naive UTC datetimes.
    return float(expiry.replace(tzinfo=UTC).timestamp())


def _fresh(credentials: Any, now: float) -> bool:
    if not getattr(credentials, "token", None):
        return False
    expires_at = _expires_at(credentials)
    return expires_at == math.inf or now < expires_at - REFRESH_BEFORE_EXPIRY_S


def _retrieve(future: asyncio.Future[None]) -> None:
    # A background refresh's failure is raised to the GET that waits for it, if any.
    if not future.cancelled():
        future.exception()
