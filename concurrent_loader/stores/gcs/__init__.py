"""The Google Cloud Storage backend (``gs://bucket/prefix``) over the JSON API; credentials
through google-auth (the ``gcs`` extra), anonymous for public buckets and emulators."""

from .store import GcsConfig, GcsStore

__all__ = ["GcsConfig", "GcsStore"]
