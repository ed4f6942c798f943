"""``AzureConfig``: the root URL, the account, the endpoint and the credential as Azure's
own tools find them, and what it never shows (keys, SAS tokens, connection strings)."""

from __future__ import annotations

import base64
import pickle
import sys

import pytest

from concurrent_loader.errors import ConfigError
from concurrent_loader.stores import store_config_for
from concurrent_loader.stores.azure import (
    Anonymous,
    AzureConfig,
    EntraId,
    SasToken,
    SharedKey,
)
from concurrent_loader.stores.azure.credentials import AZURITE_ACCOUNT, AZURITE_KEY

KEY = base64.b64encode(b"k" * 64).decode()
SAS = "sv=2023-11-03&sr=c&sp=rl&se=2030-01-01&sig=c2VjcmV0LXNpZ25hdHVyZQ%3D%3D"
EXPLICIT = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:10555/devstoreaccount1;"
)
PRODUCTION = (
    f"DefaultEndpointsProtocol=https;AccountName=prod;AccountKey={KEY};"
    "EndpointSuffix=core.windows.net"
)


@pytest.mark.parametrize(
    "url,options,env,want",
    [
        # (account, container, prefix, endpoint, credential)
        (
            "az://images/train",
            {},
            {"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"},
            (
                AZURITE_ACCOUNT,
                "images",
                "train/",
                "http://127.0.0.1:10000/devstoreaccount1",
                SharedKey(AZURITE_KEY),
            ),
        ),
        (
            "az://images/",
            {},
            {"AZURE_STORAGE_CONNECTION_STRING": EXPLICIT},
            (
                AZURITE_ACCOUNT,
                "images",
                "",
                "http://127.0.0.1:10555/devstoreaccount1",
                SharedKey(AZURITE_KEY),
            ),
        ),
        (
            "az://c/p/q/",
            {},
            {"AZURE_STORAGE_CONNECTION_STRING": PRODUCTION},
            ("prod", "c", "p/q/", "https://prod.blob.core.windows.net", SharedKey(KEY)),
        ),
        (
            "az://c",
            {},
            {
                "AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint=https://sas.blob.core.windows.net/;SharedAccessSignature=?{SAS}"
            },
            ("sas", "c", "", "https://sas.blob.core.windows.net", SasToken(SAS)),
        ),
        (
            "https://acct.blob.core.windows.net/data/shards/",
            {},
            {},
            ("acct", "data", "shards/", "https://acct.blob.core.windows.net", EntraId()),
        ),
        (
            "https://acct.blob.core.windows.net/data",
            {"anonymous": True},
            {"AZURE_STORAGE_KEY": KEY},
            ("acct", "data", "", "https://acct.blob.core.windows.net", Anonymous()),
        ),
        (
            "az://c/x",
            {},
            {"AZURE_STORAGE_ACCOUNT": "cli", "AZURE_STORAGE_KEY": KEY},
            ("cli", "c", "x/", "https://cli.blob.core.windows.net", SharedKey(KEY)),
        ),
        (
            "az://c/x",
            {},
            {"AZURE_STORAGE_ACCOUNT": "cli", "AZURE_STORAGE_SAS_TOKEN": "?" + SAS},
            ("cli", "c", "x/", "https://cli.blob.core.windows.net", SasToken(SAS)),
        ),
        (
            # explicit options win over the environment's connection string
            "az://c/x",
            {"account_name": "mine", "sas_token": SAS, "endpoint_url": "http://127.0.0.1:9/mine/"},
            {"AZURE_STORAGE_CONNECTION_STRING": PRODUCTION},
            ("mine", "c", "x/", "http://127.0.0.1:9/mine", SasToken(SAS)),
        ),
        (
            # the environment's connection string is for another account: not used
            "https://other.blob.core.windows.net/c",
            {},
            {"AZURE_STORAGE_CONNECTION_STRING": PRODUCTION},
            ("other", "c", "", "https://other.blob.core.windows.net", EntraId()),
        ),
    ],
    ids=[
        "dev-storage",
        "explicit-azurite",
        "production-key",
        "sas-string",
        "https-entra",
        "anonymous",
        "cli-key",
        "cli-sas",
        "explicit-wins",
        "other-account",
    ],
)
def test_the_config_comes_from_the_url_options_and_environment(url, options, env, want):
    config = AzureConfig.from_url(url, environ=env, **options)
    got = (config.account, config.container, config.prefix, config.endpoint, config.credential)
    assert got == want
    assert config.url_for("k/1.jpg") == f"az://{want[1]}/{want[2]}k/1.jpg"
    assert pickle.loads(pickle.dumps(config)) == config
    assert hash(config) == hash(pickle.loads(pickle.dumps(config)))
    for secret in (KEY, AZURITE_KEY, SAS, "c2VjcmV0"):
        assert secret not in repr(config) and secret not in str(config)


@pytest.mark.parametrize(
    "url,options,env,message",
    [
        ("az://c/p", {}, {}, "no Azure storage account"),
        ("az://c/p", {"account_key": KEY, "sas_token": SAS}, {}, "give one Azure credential"),
        (
            "az://c/p",
            {"connection_string": "AccountName=a;AccountKey"},
            {},
            "malformed Azure connection",
        ),
        ("az://c/p", {"connection_string": f"AccountKey={KEY}"}, {}, "no AccountName"),
        (
            "az://c/p",
            {"account_name": "a", "endpoint_url": "ftp://h"},
            {},
            "malformed Azure endpoint",
        ),
        ("az://a@c/p", {}, {}, "malformed Azure URL"),
        ("s3://bucket/p", {}, {}, "Azure options apply"),
        ("https://example.com/c/p", {}, {}, "Azure options apply"),
        ("https://acct.blob.core.windows.net/c?" + SAS, {}, {}, "pass sas_token="),
        ("https://acct.blob.core.windows.net/", {}, {}, "no container"),
        ("az://c/p", {"account_name": "a", "sas_token": "sv=1&sig=c2VjcmV0\r\nX: y"}, {}, "SAS"),
        (
            "az://c/p",
            {"account_name": "b", "connection_string": PRODUCTION},
            {},
            "connection string is for account 'prod'",
        ),
    ],
)
def test_a_bad_root_or_option_is_a_config_error_that_shows_no_secret(url, options, env, message):
    with pytest.raises(ConfigError, match=message) as raised:
        AzureConfig.from_url(url, environ=env, **options)
    for secret in (KEY, SAS, "c2VjcmV0"):
        assert secret not in str(raised.value)


def test_a_credential_object_is_refused_for_what_makes_one_in_each_process():
    class Made:
        def get_token(self, *scopes: str) -> None: ...

    with pytest.raises(ConfigError, match="ManagedIdentityCredential"):
        AzureConfig.from_url("az://c/", account_name="a", credential=Made(), environ={})
    config = AzureConfig.from_url("az://c/", account_name="a", credential=Made, environ={})
    assert config.credential == EntraId(Made)


def test_az_roots_are_registered_and_read_the_environment(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true")
    config = store_config_for("az://images/train/")
    assert isinstance(config, AzureConfig) and config.credential == SharedKey(AZURITE_KEY)
    assert config.capabilities.listing and config.capabilities.ranges
    # Two accounts' containers of one name never share a cache entry: the route differs.
    other = AzureConfig.from_url("az://images/train/", account_name="b", account_key=KEY)
    assert config.route != other.route


def test_entra_id_without_azure_identity_is_a_config_error_saying_how(monkeypatch):
    from concurrent_loader.config import FetchConfig

    monkeypatch.setitem(sys.modules, "azure.identity", None)  # import fails, as when missing
    config = AzureConfig.from_url("https://acct.blob.core.windows.net/c/", environ={})
    with pytest.raises(ConfigError, match=r"concurrent-loader\[azure\]") as raised:
        config.open(FetchConfig())
    assert raised.value.url == "az://c/"
