"""The Azure Blob Storage backend (``az://container/prefix``; Azurite for tests)."""

from .credentials import Anonymous, AzureCredential, EntraId, SasToken, SharedKey
from .store import AzureConfig, AzureStore

__all__ = [
    "Anonymous",
    "AzureConfig",
    "AzureCredential",
    "AzureStore",
    "EntraId",
    "SasToken",
    "SharedKey",
]
