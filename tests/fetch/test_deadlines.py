"""The object's time budget holds through a real transport, whatever the server does: it
trickles a byte at a time (each within the read timeout), stalls after the headers, or
never answers. Every case ends in a ``FetchTimeout`` naming the object, with no socket left
open; time scales are small (an attempt of 0.3 s, a budget of 0.8 s)."""

from __future__ import annotations

import asyncio
import time

import pytest

from concurrent_loader.config import FetchConfig, RetryConfig, Timeouts
from concurrent_loader.errors import FetchTimeout, Reason
from concurrent_loader.fetch import FetchClient
from concurrent_loader.stores.http import HttpConfig
from tests.transport._server import open_sockets

ATTEMPT_S = 0.3
BUDGET_S = 0.8
# The per-phase timeouts are far longer than the budget: only the deadlines can end these.
CONFIG = FetchConfig(
    timeouts=Timeouts(connect=5.0, first_byte=5.0, read=5.0, attempt=ATTEMPT_S),
    retry=RetryConfig(max_attempts=10, base_delay=0.0, max_total_seconds=BUDGET_S),
)


class MisbehavingServer:
    """``/trickle``: headers for 1 MB, then one byte every 20 ms; ``/stall``: headers and
    ten bytes, then silence; ``/silent``: reads the request and never answers. Counts the
    requests it received and the connections still open."""

    def __init__(self) -> None:
        self.requests = 0
        self.open = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> MisbehavingServer:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            path = head.split(b" ")[1].decode()
            if path == "/trickle":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                while True:
                    writer.write(b"x")
                    await writer.drain()
                    await asyncio.sleep(0.02)
            elif path == "/stall":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
                await writer.drain()
            await reader.read()  # until the client closes the connection
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            writer.close()
            self._tasks.discard(task)


@pytest.mark.parametrize("behaviour", ["trickle", "stall", "silent"])
def test_the_time_budget_holds_however_the_server_behaves(behaviour):
    async def main() -> None:
        before = open_sockets()
        async with MisbehavingServer() as server:
            store = HttpConfig.from_url(f"http://127.0.0.1:{server.port}/")
            client = FetchClient(store.open(CONFIG), CONFIG)
            started = time.monotonic()
            with pytest.raises(FetchTimeout) as caught:
                await client.get(behaviour)
            elapsed = time.monotonic() - started
            await client.close()
            error = caught.value
            assert error.cause is Reason.DEADLINE_EXCEEDED
            assert error.url == f"http://127.0.0.1:{server.port}/{behaviour}"
            # Attempts were cut off at 0.3 s and retried (retries do not wait): 0.8 s allows
            # a third one (on a loaded machine, perhaps only two).
            assert server.requests in (2, 3)
            assert isinstance(error.__cause__, FetchTimeout)
            assert error.__cause__.cause is Reason.ATTEMPT_TIMEOUT
            # Generous against a loaded machine; without the deadlines this runs forever.
            assert elapsed < BUDGET_S + 2.0
            for _ in range(100):  # the server sees each cut-off connection close
                if server.open == 0:
                    break
                await asyncio.sleep(0.01)
            assert server.open == 0
        assert open_sockets() <= before

    asyncio.run(main())
