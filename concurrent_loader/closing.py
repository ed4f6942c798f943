"""One context-manager protocol for every object with an explicit ``close()``."""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """Mixin: ``with obj:`` returns ``obj`` and calls ``obj.close()`` on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
