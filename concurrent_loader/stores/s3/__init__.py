"""The S3 backend (AWS S3 and S3-compatible stores: MinIO, SeaweedFS, Ceph, R2, ...)."""

from .credentials import CredentialSource
from .store import S3Config, S3Store

__all__ = ["CredentialSource", "S3Config", "S3Store"]
