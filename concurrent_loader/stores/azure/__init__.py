"""The Azure Blob Storage backend (``az://container/prefix``; Azurite for tests)."""

from .config import Anonymous, AzureConfig, AzureCredential, EntraId, SasToken, SharedKey
from .store import AzureStore

__all__ = [
    "Anonymous",
    "AzureConfig",
    "AzureCredential",
    "AzureStore",
    "EntraId",
    "SasToken",
    "SharedKey",
]
