"""A FetchObserver for the fetch tests (imported by name: this folder is on sys.path)."""

from __future__ import annotations

from concurrent_loader.errors import FetchError


class Recorder:
    """A FetchObserver that keeps what it was told."""

    def __init__(self) -> None:
        self.responses: list[tuple[float, int, float | None]] = []
        self.retries: list[FetchError] = []
        self.throttles = 0
        self.hedges = 0
        self.hedges_won = 0

    def on_response(self, seconds: float, size: int, first_byte_s: float | None) -> None:
        self.responses.append((seconds, size, first_byte_s))

    def on_retry(self, error: FetchError) -> None:
        self.retries.append(error)

    def on_throttle(self) -> None:
        self.throttles += 1

    def on_hedge(self) -> None:
        self.hedges += 1

    def on_hedge_won(self) -> None:
        self.hedges_won += 1
