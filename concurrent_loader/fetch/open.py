"""Where each process gets its fetch client: made on first use inside the process and event
loop that use it (whatever the start method) and cached on the process's runtime.
"""

from __future__ import annotations

from ..config import FetchConfig
from ..runtime import Runtime
from ..stores.base import StoreConfig
from .client import FetchClient

__all__ = ["client_for"]


async def client_for(
    runtime: Runtime, store: StoreConfig, config: FetchConfig, *, start: int | None = None
) -> FetchClient:
    """This process's client for ``store`` under ``config`` (on the runtime's loop); a new
    one's self-tuned limit starts at ``start`` (None: ``config.inflight_start``)."""

    async def make() -> FetchClient:
        return FetchClient(store.open(config), config, start=start)

    client: FetchClient = await runtime.resource(("fetch-client", store, config), make)
    return client
