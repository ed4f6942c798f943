"""Where an Azure Blob Storage container is and how to reach it: :class:`AzureConfig`.

Credentials are found as Azure's own tools find them, first found wins:

1. what the caller gives: ``connection_string=``, ``account_key=``, ``sas_token=``,
   ``credential=`` (a picklable callable that makes an ``azure.core`` ``TokenCredential``
   in each process: ``azure.identity.ManagedIdentityCredential``, say) or ``anonymous=True``;
2. ``AZURE_STORAGE_CONNECTION_STRING`` (``AccountKey`` or ``SharedAccessSignature``;
   ``UseDevelopmentStorage=true`` is Azurite's well-known account on 127.0.0.1:10000);
3. ``AZURE_STORAGE_KEY``, then ``AZURE_STORAGE_SAS_TOKEN`` (the Azure CLI's);
4. Entra ID through ``azure-identity``'s ``DefaultAzureCredential`` (the ``azure`` extra).

The account comes from the URL's host, ``account_name=``, the connection string or
``AZURE_STORAGE_ACCOUNT``; the endpoint only from ``endpoint_url=``, the URL, the connection
string, or else ``https://<account>.blob.core.windows.net``: requests go nowhere else.
Keys, SAS tokens and connection strings never appear in a repr or a message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from ...config import FetchConfig
from ...errors import ConfigError
from ...transport import Origin
from ..base import Capabilities

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "Anonymous",
    "AzureConfig",
    "AzureCredential",
    "AzureRoute",
    "EntraId",
    "SasToken",
    "SharedKey",
    "parse_connection_string",
]

_CAPABILITIES = Capabilities(remote=True, listing=True, ranges=True)

#: Azurite's (and the old storage emulator's) well-known development account and key
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_BLOB_HOST_SUFFIX = ".blob.core.windows.net"


@dataclass(frozen=True)
class SharedKey:
    """The storage account's key (base64): every request is signed with it."""

    key: str = field(repr=False)

    def __repr__(self) -> str:
        return "SharedKey(<hidden>)"


@dataclass(frozen=True)
class SasToken:
    """A shared access signature, appended to every request's query."""

    token: str = field(repr=False)

    def __repr__(self) -> str:
        return "SasToken(<hidden>)"


@dataclass(frozen=True)
class EntraId:
    """Entra ID bearer tokens, from the ``TokenCredential`` that ``factory`` makes in each
    process, or from ``DefaultAzureCredential``."""

    #: a picklable callable that returns the credential (None: ``DefaultAzureCredential``)
    factory: Any = None


@dataclass(frozen=True)
class Anonymous:
    """No credential: a container with public read access."""


AzureCredential = SharedKey | SasToken | EntraId | Anonymous


@dataclass(frozen=True)
class AzureRoute:
    """Where requests go: the endpoint's origin and its path (``/devstoreaccount1`` for
    Azurite's path-style endpoint, empty for ``<account>.blob.core.windows.net``)."""

    origin: Origin
    path_prefix: str


def parse_connection_string(text: str) -> dict[str, str]:
    """``Name=value;...`` -> a dict (names as written); a value may hold ``=``."""
    found: dict[str, str] = {}
    for item in text.split(";"):
        name, sep, value = item.strip().partition("=")
        if not item.strip():
            continue
        if not sep or not name:
            # Not echoed: the string holds the account key.
            raise ConfigError("malformed Azure connection string: expected Name=value;...")
        found[name.strip()] = value.strip()
    return found


@dataclass(frozen=True)
class AzureConfig:
    """``az://container/prefix`` in one storage account, and how to reach it."""

    account: str
    container: str
    prefix: str
    #: ``scheme://host[:port][/path]``: the blob service's base URL, without a trailing ``/``
    endpoint: str
    credential: AzureCredential = field(default_factory=EntraId)
    #: a CA bundle to trust instead of the system's
    ca_bundle: str | None = None
    #: check bodies against ``Content-MD5`` (whole blobs) and ``x-ms-blob-content-md5`` (ranges)
    verify_checksums: bool = True

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def route(self) -> AzureRoute:
        parts = urlsplit(self.endpoint)
        return AzureRoute(Origin.from_url(self.endpoint), parts.path.rstrip("/"))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        account_name: str | None = None,
        account_key: str | None = None,
        sas_token: str | None = None,
        connection_string: str | None = None,
        credential: Any = None,
        anonymous: bool = False,
        endpoint_url: str | None = None,
        ca_bundle: str | None = None,
        verify_checksums: bool = True,
        environ: Mapping[str, str] | None = None,
    ) -> AzureConfig:
        """The config for ``az://container/prefix`` or
        ``https://<account>.blob.core.windows.net/container/prefix`` (credentials and
        endpoint as the module docstring says; ``environ`` defaults to ``os.environ``)."""
        env = os.environ if environ is None else environ
        container, prefix, url_account, url_endpoint = _parse_url(url)
        given = [
            name
            for name, value in (
                ("account_key", account_key),
                ("sas_token", sas_token),
                ("connection_string", connection_string),
                ("credential", credential),
                ("anonymous", anonymous or None),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigError(f"give one Azure credential, not {' and '.join(given)}", url=url)
        if connection_string is None and not given:
            connection_string = env.get("AZURE_STORAGE_CONNECTION_STRING") or None
        settings = _connection_settings(connection_string) if connection_string else {}
        account = account_name or url_account or settings.get("account")
        account = account or env.get("AZURE_STORAGE_ACCOUNT")
        if not account:
            raise ConfigError(
                f"no Azure storage account for {url!r}: pass account_name=, set "
                "AZURE_STORAGE_ACCOUNT or AZURE_STORAGE_CONNECTION_STRING, or give the "
                "https://<account>.blob.core.windows.net/ URL",
                url=url,
            )
        if settings and settings["account"] != account:
            if connection_string is not None and "connection_string" in given:
                raise ConfigError(
                    f"the connection string is for account {settings['account']!r}, "
                    f"not {account!r}",
                    url=url,
                )
            settings = {}  # the environment's string is for another account
        endpoint = (
            endpoint_url
            or url_endpoint
            or settings.get("endpoint")
            or f"https://{account}{_BLOB_HOST_SUFFIX}"
        ).rstrip("/")
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise ConfigError(
                f"malformed Azure endpoint {endpoint!r}: expected http(s)://host[:port][/path]",
                url=url,
            )
        Origin.from_url(endpoint)  # validates host and port
        found = _credential(account_key, sas_token, credential, anonymous, settings, env)
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ConfigError(f"ca_bundle {ca_bundle!r} is not a file")
        return cls(account, container, prefix, endpoint, found, ca_bundle, verify_checksums)

    def url_for(self, key: str) -> str:
        return f"az://{self.container}/{self.prefix}{key}"

    def resolved(self) -> AzureConfig:
        return self

    def open(self, fetch: FetchConfig) -> Any:
        from .store import AzureStore

        return AzureStore(self, fetch)

    def container_path(self) -> str:
        """The container's request path: the endpoint's path, then ``/container``."""
        return f"{self.route.path_prefix}/{quote(self.container, safe='')}"

    def __str__(self) -> str:
        return self.url_for("")


def _parse_url(url: str) -> tuple[str, str, str | None, str | None]:
    """(container, prefix, account or None, endpoint or None) of an Azure root URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "az":
        if not parts.netloc or "@" in parts.netloc or ":" in parts.netloc:
            raise ConfigError(f"malformed Azure URL {url!r}: expected az://container/prefix")
        container, path, account, endpoint = parts.netloc, parts.path, None, None
    elif scheme == "https" and (parts.hostname or "").endswith(_BLOB_HOST_SUFFIX):
        if parts.username or parts.password or parts.query:
            raise ConfigError("an Azure blob URL takes no credentials or query: pass sas_token=")
        account = (parts.hostname or "").removesuffix(_BLOB_HOST_SUFFIX)
        endpoint = f"https://{parts.netloc}"
        container, _, path = parts.path.lstrip("/").partition("/")
        if not container:
            raise ConfigError(f"malformed Azure URL {url!r}: no container")
    else:
        raise ConfigError(
            f"Azure options apply to az://container/prefix or "
            f"https://<account>{_BLOB_HOST_SUFFIX}/container/prefix, not {url!r}"
        )
    prefix = path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return container, prefix, account, endpoint


def _connection_settings(text: str) -> dict[str, str]:
    """A connection string's account, endpoint, key and SAS (those it has)."""
    found = {name.lower(): value for name, value in parse_connection_string(text).items()}
    if found.get("usedevelopmentstorage", "").lower() == "true":
        return {
            "account": AZURITE_ACCOUNT,
            "endpoint": f"http://127.0.0.1:10000/{AZURITE_ACCOUNT}",
            "key": AZURITE_KEY,
        }
    account = found.get("accountname", "")
    endpoint = found.get("blobendpoint", "")
    if not endpoint and account:
        protocol = found.get("defaultendpointsprotocol", "https")
        suffix = found.get("endpointsuffix", "core.windows.net")
        endpoint = f"{protocol}://{account}.blob.{suffix}"
    if not account and endpoint:
        host = urlsplit(endpoint).hostname or ""
        account = host.removesuffix(_BLOB_HOST_SUFFIX) if host.endswith(_BLOB_HOST_SUFFIX) else ""
    if not account or not endpoint:
        raise ConfigError("malformed Azure connection string: no AccountName or BlobEndpoint")
    settings = {"account": account, "endpoint": endpoint}
    if found.get("accountkey"):
        settings["key"] = found["accountkey"]
    if found.get("sharedaccesssignature"):
        settings["sas"] = found["sharedaccesssignature"]
    return settings


def _credential(
    account_key: str | None,
    sas_token: str | None,
    credential: Any,
    anonymous: bool,
    settings: Mapping[str, str],
    env: Mapping[str, str],
) -> AzureCredential:
    if anonymous:
        return Anonymous()
    if credential is not None:
        return EntraId(credential)
    key = account_key or settings.get("key")
    sas = sas_token or settings.get("sas")
    if not (key or sas or settings):
        key = env.get("AZURE_STORAGE_KEY") or None
        sas = None if key else env.get("AZURE_STORAGE_SAS_TOKEN") or None
    if key:
        return SharedKey(key)
    if sas:
        return SasToken(sas.lstrip("?"))
    return EntraId()
