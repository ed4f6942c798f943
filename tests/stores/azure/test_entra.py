"""Entra ID tokens: fetched off the event loop, once for every GET that needs one at that
moment, fetched again before expiry while GETs go on with the old one, and never shown."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import NamedTuple

import pytest

from concurrent_loader.errors import AccessDenied, Reason
from concurrent_loader.stores.azure.entra import (
    REFRESH_BEFORE_EXPIRY_S,
    SCOPE,
    USABLE_UNTIL_EXPIRY_S,
    EntraTokens,
)


class AccessToken(NamedTuple):
    token: str
    expires_on: int


class IssuingCredential:
    """A ``TokenCredential`` that issues numbered tokens living ``lifetime_s``, blocking
    ``delay_s`` per call (as a metadata endpoint would), on whichever thread calls it."""

    def __init__(self, lifetime_s: float, delay_s: float = 0.05, fail: bool = False) -> None:
        self.lifetime_s, self.delay_s, self.fail = lifetime_s, delay_s, fail
        self.calls: list[tuple[tuple[str, ...], str]] = []

    def get_token(self, *scopes: str) -> AccessToken:
        self.calls.append((scopes, threading.current_thread().name))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("no managed identity endpoint here")
        return AccessToken(f"token-{len(self.calls)}", int(time.time() + self.lifetime_s))


async def bearer(tokens: EntraTokens) -> str:
    """What a GET does: refresh when due, then take the header."""
    if tokens.refresh_due():
        await tokens.refresh()
    return dict(tokens.headers())["Authorization"]


def test_concurrent_gets_share_one_fetch_made_off_the_loop():
    credential = IssuingCredential(lifetime_s=3600)
    tokens = EntraTokens(credential, "az://c/")

    async def main() -> list[str]:
        return await asyncio.gather(*(bearer(tokens) for _ in range(50)))

    assert asyncio.run(main()) == ["Bearer token-1"] * 50
    assert len(credential.calls) == 1
    scopes, thread = credential.calls[0]
    assert scopes == (SCOPE,) and thread != threading.main_thread().name
    assert "token-1" not in repr(tokens)


def test_a_token_near_expiry_is_refreshed_while_gets_go_on_with_it():
    lifetime = (REFRESH_BEFORE_EXPIRY_S + USABLE_UNTIL_EXPIRY_S) / 2 + 5
    credential = IssuingCredential(lifetime_s=lifetime, delay_s=0.2)
    tokens = EntraTokens(credential, "az://c/")

    async def main() -> tuple[str, str, str]:
        first = await bearer(tokens)  # waits: there is none yet
        assert tokens.refresh_due()  # issued inside the refresh window
        during = await bearer(tokens)  # starts a refresh, does not wait for it
        await asyncio.sleep(0.5)
        return first, during, await bearer(tokens)

    first, during, after = asyncio.run(main())
    assert (first, during) == ("Bearer token-1", "Bearer token-1")
    assert after in ("Bearer token-2", "Bearer token-3")  # each one is again near expiry
    assert 2 <= len(credential.calls) <= 3


def test_an_expiring_token_is_waited_for():
    credential = IssuingCredential(lifetime_s=USABLE_UNTIL_EXPIRY_S / 2)
    tokens = EntraTokens(credential, "az://c/")

    async def main() -> list[str]:
        return [await bearer(tokens) for _ in range(3)]

    assert asyncio.run(main()) == ["Bearer token-1", "Bearer token-2", "Bearer token-3"]


def test_a_failed_fetch_is_access_denied_naming_the_container():
    tokens = EntraTokens(IssuingCredential(3600, fail=True), "az://c/p/")
    with pytest.raises(AccessDenied) as raised:
        asyncio.run(bearer(tokens))
    assert raised.value.url == "az://c/p/" and raised.value.cause is Reason.NO_CREDENTIALS
    assert "no managed identity endpoint here" in str(raised.value)


def test_a_failed_refresh_while_the_token_lasts_is_tried_again_only_after_a_while():
    lifetime = (REFRESH_BEFORE_EXPIRY_S + USABLE_UNTIL_EXPIRY_S) / 2 + 5
    credential = IssuingCredential(lifetime_s=lifetime, delay_s=0.0)
    tokens = EntraTokens(credential, "az://c/")

    async def main() -> list[str]:
        first = await bearer(tokens)
        credential.fail = True
        got = []
        for _ in range(20):  # each would start a refresh, were it not held back
            got.append(await bearer(tokens))
            await asyncio.sleep(0.01)
        return [first, *got]

    assert set(asyncio.run(main())) == {"Bearer token-1"}
    assert len(credential.calls) == 2  # the first fetch, one failed refresh
