"""How a request is authorised, one class per credential (:func:`authorizer_for`): each
gives the headers of a ``GET path?query`` that sends ``x_ms`` (``x-ms-range``), and the
query suffix every request carries (a SAS token; else empty)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .credentials import AzureCredential, EntraId, SasToken, SharedKey
from .entra import EntraTokens, default_credential
from .sharedkey import API_VERSION, SharedKeySigner

__all__ = ["Authorizer", "authorizer_for"]

_VERSION_HEADER = ("x-ms-version", API_VERSION)
Headers = list[tuple[str, str]]


class Authorizer(Protocol):
    #: appended to every request's query (``&`` or ``?`` first): a SAS token, or empty
    query_suffix: str

    async def headers(
        self, path: str, query: Sequence[tuple[str, str]], x_ms: Sequence[tuple[str, str]]
    ) -> Headers: ...

    def close(self) -> None: ...


class _SharedKey:
    query_suffix = ""

    def __init__(self, account: str, key: str) -> None:
        self._signer = SharedKeySigner(account, key)

    async def headers(
        self, path: str, query: Sequence[tuple[str, str]], x_ms: Sequence[tuple[str, str]]
    ) -> Headers:
        return [*x_ms, *self._signer.headers(path, query, x_ms)]

    def close(self) -> None:
        pass


class _Unsigned:
    """A SAS token in the query (it is the authorisation), or nothing (public access)."""

    def __init__(self, query_suffix: str) -> None:
        self.query_suffix = query_suffix

    async def headers(
        self, path: str, query: Sequence[tuple[str, str]], x_ms: Sequence[tuple[str, str]]
    ) -> Headers:
        return [*x_ms, _VERSION_HEADER]

    def close(self) -> None:
        pass


class _Bearer:
    query_suffix = ""

    def __init__(self, tokens: EntraTokens) -> None:
        self._tokens = tokens

    async def headers(
        self, path: str, query: Sequence[tuple[str, str]], x_ms: Sequence[tuple[str, str]]
    ) -> Headers:
        if self._tokens.refresh_due():
            await self._tokens.refresh()
        return [*x_ms, _VERSION_HEADER, *self._tokens.headers()]

    def close(self) -> None:
        self._tokens.close()


def authorizer_for(credential: AzureCredential, account: str, url: str) -> Authorizer:
    """The authorizer of ``credential`` for ``account`` (``url`` names the root in errors)."""
    if isinstance(credential, SharedKey):
        return _SharedKey(account, credential.key)
    if isinstance(credential, SasToken):
        return _Unsigned(credential.token)
    if isinstance(credential, EntraId):
        made = credential.factory() if credential.factory else default_credential(url)
        return _Bearer(EntraTokens(made, url))
    return _Unsigned("")  # Anonymous
