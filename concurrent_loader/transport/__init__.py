"""HTTP clients for the GET of every object: HTTP only, nothing about any store."""

from .origin import Origin

__all__ = ["Origin"]
