"""Azure credentials and endpoints, found as Azure's own tools find them (for
:meth:`~.store.AzureConfig.from_url`). Credentials, first found wins:

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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...errors import ConfigError
from ...transport import Origin

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "BLOB_HOST_SUFFIX",
    "Anonymous",
    "AzureCredential",
    "AzureRoute",
    "EntraId",
    "SasToken",
    "SharedKey",
    "connection_settings",
    "find_credential",
    "parse_connection_string",
    "parse_url",
]

#: Azurite's (and the old storage emulator's) well-known development account and key
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
BLOB_HOST_SUFFIX = ".blob.core.windows.net"


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


def parse_url(url: str) -> tuple[str, str, str | None, str | None]:
    """(container, prefix, account or None, endpoint or None) of an Azure root URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "az":
        if not parts.netloc or "@" in parts.netloc or ":" in parts.netloc:
            raise ConfigError(f"malformed Azure URL {url!r}: expected az://container/prefix")
        container, path, account, endpoint = parts.netloc, parts.path, None, None
    elif scheme == "https" and (parts.hostname or "").endswith(BLOB_HOST_SUFFIX):
        if parts.username or parts.password or parts.query:
            raise ConfigError("an Azure blob URL takes no credentials or query: pass sas_token=")
        account = (parts.hostname or "").removesuffix(BLOB_HOST_SUFFIX)
        endpoint = f"https://{parts.netloc}"
        container, _, path = parts.path.lstrip("/").partition("/")
        if not container:
            raise ConfigError(f"malformed Azure URL {url!r}: no container")
    else:
        raise ConfigError(
            f"Azure options apply to az://container/prefix or "
            f"https://<account>{BLOB_HOST_SUFFIX}/container/prefix, not {url!r}"
        )
    prefix = path.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return container, prefix, account, endpoint


def connection_settings(text: str) -> dict[str, str]:
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
        account = host.removesuffix(BLOB_HOST_SUFFIX) if host.endswith(BLOB_HOST_SUFFIX) else ""
    if not account or not endpoint:
        raise ConfigError("malformed Azure connection string: no AccountName or BlobEndpoint")
    settings = {"account": account, "endpoint": endpoint}
    if found.get("accountkey"):
        settings["key"] = found["accountkey"]
    if found.get("sharedaccesssignature"):
        settings["sas"] = found["sharedaccesssignature"]
    return settings


def find_credential(
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
        token = sas.strip().lstrip("?")
        if not token or any(c.isspace() or c in '#?"<>' or not c.isascii() for c in token):
            # Not echoed: it is the credential. It goes into every request's target as is.
            raise ConfigError("malformed Azure SAS token: expected sv=...&sig=... (URL-encoded)")
        return SasToken(token)
    return EntraId()
