"""Stage 1 of the pipeline: turning keys into bytes.

Readers for S3 (:class:`S3Reader`), plain HTTP(S) (:class:`HttpReader`) and local files
(:class:`LocalReader`) share one contract (:class:`Reader`): whole objects or a
:class:`~concurrent_loader.errors.FetchError` naming the object, a bounded number of
requests in flight that backs off under throttling, and retries with full-jitter backoff.
"""

from .base import Reader
from .credentials import CredentialSource
from .http import HttpReader
from .local import LocalReader
from .s3 import ListedObject, S3Reader, list_objects

__all__ = [
    "CredentialSource",
    "HttpReader",
    "ListedObject",
    "LocalReader",
    "Reader",
    "S3Reader",
    "list_objects",
]
