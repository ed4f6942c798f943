"""Fixtures of the unit tests: the loader's own logic on the in-memory store, no server
(:mod:`tests.helpers`: numbered objects, scripted latencies, and the check that a test
leaves none of the loader's threads running)."""

from tests.helpers import helpers, no_loader_threads_left

__all__ = ["helpers", "no_loader_threads_left"]
