"""Fixtures of the key table tests: :mod:`tests.helpers` (numbered objects on the in-memory
store; no test leaves the loader's threads running)."""

from tests.helpers import helpers, no_loader_threads_left

__all__ = ["helpers", "no_loader_threads_left"]
