"""Reliability suite: faults, bad input, shutdown, memory bounds, credentials, skip policy."""
