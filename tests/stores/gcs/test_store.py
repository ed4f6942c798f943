"""The GCS config, the requests the store sends and the errors it raises, against a loopback
recorder (GCS-shaped answers: JSON errors, 429 with Retry-After, tokens) and fake-gcs-server
(pagination)."""

from __future__ import annotations

import asyncio
import datetime
import pickle
import sys
import time
from typing import Any

import pytest
from google.auth.credentials import Credentials

from concurrent_loader import ConcurrentDataLoader, FetchConfig, ObjectDataset, RetryConfig
from concurrent_loader.errors import (
    AccessDenied,
    ConfigError,
    FetchError,
    ObjectNotFound,
    Reason,
    Throttled,
)
from concurrent_loader.fetch.client import FetchClient
from concurrent_loader.stores import GcsConfig, store_config_for
from concurrent_loader.stores.gcs import store as gcs_store

from .conftest import Recorder


@pytest.mark.parametrize(
    "url,bucket,prefix",
    [
        ("gs://b", "b", ""),
        ("gs://b/", "b", ""),
        ("gs://b/p", "b", "p/"),
        ("gs://b/p/q/", "b", "p/q/"),
        ("GS://b/p", "b", "p/"),
    ],
)
def test_from_url_parses_bucket_and_prefix(url, bucket, prefix, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    config = GcsConfig.from_url(url, anonymous=True)
    assert (config.bucket, config.prefix, config.endpoint_url) == (bucket, prefix, None)
    assert config.url_for("k/x.jpg") == f"gs://{bucket}/{prefix}k/x.jpg"
    assert store_config_for(url) == GcsConfig.from_url(url)  # the registry's, with defaults
    assert pickle.loads(pickle.dumps(config)) == config
    assert hash(config) == hash(GcsConfig.from_url(url, anonymous=True))


@pytest.mark.parametrize(
    "url,options,says",
    [
        ("s3://b/p", {}, "gs://bucket/prefix root"),
        ("gs:///p", {}, "malformed GCS URL"),
        ("gs://user@b/p", {}, "malformed GCS URL"),
        ("gs://b/p", {"endpoint_url": "ftp://host"}, "malformed endpoint_url"),
        ("gs://b/p", {"anonymous": True, "credentials_file": __file__}, "at most one"),
        ("gs://b/p", {"credentials_file": "/no/such/key.json"}, "is not a file"),
        ("gs://b/p", {"ca_bundle": "/no/such/ca.pem"}, "is not a file"),
        ("gs://b/p", {"credentials": "token"}, "module-level function"),
        ("gs://b/p", {"credentials": lambda: None}, "module-level function"),
    ],
)
def test_from_url_refuses_what_it_cannot_use(url, options, says):
    with pytest.raises(ConfigError, match=says):
        GcsConfig.from_url(url, **options)


def test_storage_emulator_host_is_the_endpoint_and_anonymous(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")  # no scheme: http
    config = GcsConfig.from_url("gs://b/p")
    assert (config.endpoint_url, config.anonymous) == ("http://127.0.0.1:4443", True)
    given = GcsConfig.from_url("gs://b/p", endpoint_url="https://gcs.example:8443/", anonymous=True)
    assert given.endpoint_url == "https://gcs.example:8443"  # an explicit endpoint wins


def test_without_google_auth_credentials_are_a_config_error_saying_what_to_install(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setitem(sys.modules, "google.auth", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"concurrent-loader\[gcs\]"):
        GcsConfig.from_url("gs://b/p")
    assert GcsConfig.from_url("gs://b/p", anonymous=True).anonymous  # public buckets still work


def test_listing_follows_page_tokens_with_keys_relative_to_the_prefix(gcs_server, monkeypatch):
    gcs_server.create_bucket("gcs-pages")
    names = [f"p/{i:02d}.bin" for i in range(7)] + ["p/sub/x y+%.bin", "other/z.bin"]
    for name in names:
        gcs_server.put_object("gcs-pages", name, name.encode())
    monkeypatch.setattr(gcs_store, "PAGE_SIZE", 2)  # 8 objects under p/: 4 pages

    async def listed() -> list[tuple[str, int]]:
        store = gcs_server.store_config("gcs-pages", "p").open(FetchConfig())
        try:
            return [(info.key, info.size) async for info in store.list()]
        finally:
            await store.close()

    want = sorted((n.removeprefix("p/"), len(n)) for n in names if n.startswith("p/"))
    assert sorted(asyncio.run(listed())) == want


def get_through_client(config: GcsConfig, key: str, fetch: FetchConfig | None = None) -> bytes:
    """``key`` read once through the fetch client's layers (retries, limits)."""
    fetch = fetch or FetchConfig()

    async def run() -> bytes:
        client = FetchClient(config.open(fetch), fetch)
        try:
            return bytes(await client.get(key))
        finally:
            await client.close()

    return asyncio.run(run())


def json_error(code: int, reason: str, message: str) -> bytes:
    import json

    return json.dumps(
        {"error": {"code": code, "message": message, "errors": [{"reason": reason}]}}
    ).encode()


@pytest.mark.parametrize(
    "status,reason,error,cause",
    [
        (404, "notFound", ObjectNotFound, Reason.NOT_FOUND),
        (403, "forbidden", AccessDenied, Reason.ACCESS_DENIED),
        (401, "authError", AccessDenied, Reason.ACCESS_DENIED),
    ],
)
def test_an_error_names_the_object_the_status_and_the_service_reason(
    recorder: Recorder, status, reason, error, cause
):
    recorder.script.append((status, {}, json_error(status, reason, "the service's words")))
    config = GcsConfig.from_url("gs://bk/pre", endpoint_url=recorder.endpoint_url, anonymous=True)
    with pytest.raises(error) as caught:
        get_through_client(config, "a b.jpg")
    failure = caught.value
    assert failure.url == "gs://bk/pre/a b.jpg" and failure.cause is cause
    assert (failure.status, failure.code) == (status, reason)
    assert "gs://bk/pre/a b.jpg" in str(failure) and "the service's words" in str(failure)
    assert len(recorder.seen) == 1  # not retried
    assert recorder.seen[0][0] == "/storage/v1/b/bk/o/pre%2Fa%20b.jpg?alt=media"


@pytest.mark.parametrize("status,reason", [(429, "rateLimitExceeded"), (503, "backendError")])
def test_a_throttle_is_retried_no_sooner_than_its_retry_after(recorder: Recorder, status, reason):
    recorder.objects["k"] = b"payload"
    wait_s = 0.6
    recorder.script.append((status, {"retry-after": f"{wait_s}"}, json_error(status, reason, "")))
    config = GcsConfig.from_url("gs://bk", endpoint_url=recorder.endpoint_url, anonymous=True)
    # Backoff alone would retry within 10 ms; Retry-After says 0.6 s.
    fetch = FetchConfig(retry=RetryConfig(throttle_base_delay=0.01, throttle_max_delay=0.01))
    started = time.monotonic()
    assert get_through_client(config, "k", fetch) == b"payload"
    assert time.monotonic() - started >= wait_s
    assert len(recorder.seen) == 2


def test_a_throttle_names_its_retry_after(recorder: Recorder):
    recorder.script.append((429, {"retry-after": "7"}, json_error(429, "rateLimitExceeded", "x")))
    config = GcsConfig.from_url("gs://bk", endpoint_url=recorder.endpoint_url, anonymous=True)

    async def once() -> None:
        store = config.open(FetchConfig())
        try:
            await store.get("k")
        finally:
            await store.close()

    with pytest.raises(Throttled) as caught:
        asyncio.run(once())
    assert caught.value.retry_after == 7.0 and caught.value.code == "rateLimitExceeded"
    assert pickle.loads(pickle.dumps(caught.value)).retry_after == 7.0  # across processes


# ---------------------------------------------------------------------- credentials

TOKEN_LIFE_S = 1.2


class ShortLivedCredentials(Credentials):
    """Service-account-like credentials whose tokens live :data:`TOKEN_LIFE_S` seconds and
    name when they expire (``tok-<n>-<expiry>``), so a test sees whether one went stale."""

    refreshes = 0

    def refresh(self, request: Any) -> None:
        type(self).refreshes += 1
        expiry = time.time() + TOKEN_LIFE_S
        self.token = f"tok-{type(self).refreshes}-{expiry:.3f}"
        self.expiry = datetime.datetime.fromtimestamp(expiry, datetime.UTC).replace(tzinfo=None)


def short_lived() -> ShortLivedCredentials:
    return ShortLivedCredentials()


def test_tokens_are_refreshed_before_they_expire_once_for_all_concurrent_gets(recorder):
    recorder.objects.update({f"{i}.bin": bytes([i]) * 100 for i in range(20)})
    config = GcsConfig.from_url(
        "gs://bk", endpoint_url=recorder.endpoint_url, credentials=short_lived
    )
    assert pickle.loads(pickle.dumps(config)) == config  # the factory travels by name
    ShortLivedCredentials.refreshes = 0
    rounds = 12

    async def read_for_a_while() -> None:
        store = config.open(FetchConfig())
        try:
            for _ in range(rounds):  # 20 GETs at once, every 0.25 s, over about 3 s
                bodies = await asyncio.gather(*(store.get(f"{i}.bin") for i in range(20)))
                assert [bytes(b.data) for b in bodies] == [bytes([i]) * 100 for i in range(20)]
                await asyncio.sleep(0.25)
            assert "tok-" not in repr(store) and "tok-" not in repr(store._tokens)
        finally:
            await store.close()

    started = time.time()
    asyncio.run(read_for_a_while())
    elapsed = time.time() - started
    sent = [auth for _, auth in recorder.seen]
    assert len(sent) == 20 * rounds and all(a and a.startswith("Bearer tok-") for a in sent)
    # No token arrives stale (each names its expiry; without refreshes they would be seconds
    # stale by the end; the slack is for a loaded machine's scheduling).
    for auth, arrived in zip(sent, recorder.arrived, strict=True):
        assert float(auth.rsplit("-", 1)[1]) > arrived - 0.3
    tokens = set(sent)
    assert len(tokens) >= 2  # refreshed as the test went on...
    # ... about once per three quarters of a token's life, never per GET
    assert ShortLivedCredentials.refreshes <= elapsed / (0.75 * TOKEN_LIFE_S) + 2
    assert ShortLivedCredentials.refreshes == len(tokens) < len(sent) / 10


def test_no_credentials_found_is_access_denied_naming_the_object(recorder, monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    config = GcsConfig.from_url("gs://bk/p", endpoint_url=recorder.endpoint_url)
    with pytest.raises(AccessDenied) as caught:
        get_through_client(config, "x.bin")
    assert caught.value.cause is Reason.NO_CREDENTIALS and caught.value.url == "gs://bk/p/x.bin"
    assert "anonymous=True" in str(caught.value)
    assert recorder.seen == []  # nothing sent without a token


def test_each_worker_loads_its_own_credentials_and_sends_its_token(recorder):
    recorder.objects.update({f"{i}.bin": bytes([i]) * 10 for i in range(12)})
    config = GcsConfig.from_url(
        "gs://bk", endpoint_url=recorder.endpoint_url, credentials=short_lived
    )
    ds = ObjectDataset(config, sorted(recorder.objects))
    loader = ConcurrentDataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="spawn")
    assert [bytes(b) for batch in loader for b in batch] == [
        recorder.objects[k] for k in sorted(recorder.objects)
    ]
    assert len(recorder.seen) == 12 and all(
        a and a.startswith("Bearer tok-") for _, a in recorder.seen
    )


class RefusedCredentials(Credentials):
    """Credentials the token endpoint refuses."""

    refreshes = 0

    def refresh(self, request: Any) -> None:
        from google.auth.exceptions import RefreshError

        type(self).refreshes += 1
        raise RefreshError("invalid_grant: the secret-ish answer")


def refused() -> RefusedCredentials:
    return RefusedCredentials()


def test_a_refused_refresh_is_access_denied_for_each_get_and_not_retried_at_once(recorder):
    config = GcsConfig.from_url(
        "gs://bk/p", endpoint_url=recorder.endpoint_url, credentials=refused
    )
    RefusedCredentials.refreshes = 0

    async def two_rounds() -> list[BaseException]:
        store = config.open(FetchConfig())
        try:
            errors = []
            for _ in range(2):
                results = await asyncio.gather(
                    *(store.get(f"{i}.bin") for i in range(5)), return_exceptions=True
                )
                errors += [r for r in results if isinstance(r, BaseException)]
            return errors
        finally:
            await store.close()

    errors = asyncio.run(two_rounds())
    assert len(errors) == 10 and all(isinstance(e, AccessDenied) for e in errors)
    assert sorted({e.url for e in errors}) == [f"gs://bk/p/{i}.bin" for i in range(5)]
    assert all("RefreshError" in str(e) and "secret-ish" not in str(e) for e in errors)
    assert RefusedCredentials.refreshes == 1  # one for all ten GETs, within a second
    assert recorder.seen == []


@pytest.mark.parametrize(
    "answers,outcome",
    [
        ([(503, {"retry-after": "0.1"}, json_error(503, "backendError", "busy"))], "listed"),
        ([(500, {}, b"oops")] * 2, "listed"),
        ([(403, {}, json_error(403, "forbidden", "no list permission"))], AccessDenied),
        ([(200, {}, b"<html>a portal</html>")], FetchError),
    ],
    ids=["throttled-then-listed", "failed-twice-then-listed", "denied", "not-json"],
)
def test_a_listing_page_is_retried_as_a_get_is_and_its_errors_name_the_root(
    recorder: Recorder, answers, outcome
):
    recorder.objects.update({"p/a.bin": b"a", "p/b.bin": b"bb"})
    recorder.script.extend(answers)
    config = GcsConfig.from_url("gs://bk/p", endpoint_url=recorder.endpoint_url, anonymous=True)
    fetch = FetchConfig(retry=RetryConfig(max_attempts=3, base_delay=0.01, max_delay=0.02))

    async def listed() -> list[tuple[str, int]]:
        store = config.open(fetch)
        try:
            return sorted([(info.key, info.size) async for info in store.list()])
        finally:
            await store.close()

    if outcome == "listed":
        assert asyncio.run(listed()) == [("a.bin", 1), ("b.bin", 2)]
        assert len(recorder.seen) == len(answers) + 1
        return
    with pytest.raises(outcome) as caught:
        asyncio.run(listed())
    assert (caught.value.url, caught.value.stage) == ("gs://bk/p/", "list")
    assert len(recorder.seen) == 1  # not retried
