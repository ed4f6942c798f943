"""A small TCP server that runs in the test's own process, on an event loop of its own.

:class:`BackgroundServer` is the base of the loopback helpers whose counts a test reads
directly (:class:`~.tls.TlsFront`, :class:`~.forward.ForwardProxy`): ``start()`` returns
once it listens on ``127.0.0.1``; ``stop()`` closes the listener, aborts every connection,
waits for their handlers and joins the loop's thread, and is idempotent. Subclasses write
:meth:`~BackgroundServer.handle`, one coroutine per accepted connection; the sockets it
opens itself are registered with :meth:`~BackgroundServer.track` so they close with it.

A handler runs on the server's own thread, after the client's calls return: a test reads
the counts a handler keeps once :meth:`~BackgroundServer.wait_idle` says every connection
it accepted has been handled to its end.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from typing import Any, Self

from .subprocesses import Started

__all__ = ["BackgroundServer", "pipe"]

_STOP_TIMEOUT_S = 10.0


class BackgroundServer(Started, abc.ABC):
    """An asyncio TCP server on ``127.0.0.1`` on a thread of its own."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=type(self).__name__, daemon=True
        )
        self._server: asyncio.Server | None = None
        # The streams each connection's handler has open, closed when it returns.
        self._streams: dict[asyncio.Task[Any], list[asyncio.StreamWriter]] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._active = 0
        self._started = False
        self._stopped = False
        self.port = 0

    @abc.abstractmethod
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one accepted connection (closed by the caller when this returns)."""

    def track(self, writer: asyncio.StreamWriter) -> None:
        """Close ``writer`` when the connection being handled ends (or at ``stop()``)."""
        task = asyncio.current_task()
        assert task is not None and task in self._streams
        self._streams[task].append(writer)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no accepted connection is still being handled (TimeoutError if one
        still is after ``timeout`` seconds)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._active == 0, timeout):
                raise TimeoutError(f"{self._active} connections still open after {timeout}s")

    @property
    def address(self) -> str:
        """``127.0.0.1:port``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        if self._started:
            raise RuntimeError(f"a {type(self).__name__} can be started only once")
        self._started = True
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        try:
            future.result(_STOP_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._streams[task] = [writer]
        with self._idle:
            self._active += 1
        try:
            await self.handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for stream in self._streams.pop(task):
                stream.close()
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def stop(self) -> None:
        """Close everything and join the loop's thread. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(_STOP_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_STOP_TIMEOUT_S)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Abort rather than cancel: a TLS close would wait for the peer's reply, and a
        # handler ends by itself once its streams are gone (Python 3.11 logs an error for
        # a cancelled one).
        for opened in self._streams.values():
            for stream in opened:
                stream.transport.abort()
        tasks = list(self._streams)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S / 2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of stream, then close ``writer``."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
