"""One context-manager protocol for every object with an explicit ``close()`` (or
``start()`` and ``stop()``)."""

from __future__ import annotations

from typing import Self

__all__ = ["Closing", "Started"]


class Closing:
    """Mixin: ``with obj:`` returns ``obj`` and calls ``obj.close()`` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Started:
    """Mixin: ``with obj:`` returns ``obj.start()`` and calls ``obj.stop()`` on the way out."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
