"""Loopback ports for the servers the testing tools start.

A port handed out here is free when it is handed out, lies below the kernel's ephemeral
range (so an outgoing connection cannot take it between the check and the server's bind),
and stays reserved in this process until :func:`release_ports` gives it back, so two
servers started side by side never draw the same one.
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Callable, Iterable

__all__ = ["ephemeral_low", "free_port", "release_ports", "reserve_ports"]

_reserved: set[int] = set()
_lock = threading.Lock()
_TRIES = 200


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Mirror Go's listeners (SO_REUSEADDR), so TIME_WAIT leftovers do not count as used.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def reserve_ports(
    draw: Callable[[random.Random], dict[str, int]], *, unchecked: Iterable[str] = ()
) -> dict[str, int]:
    """Reserve the ports of the first ``draw()`` none of which is reserved already and all of
    which (except those named in ``unchecked``: ports the caller asked for) are free."""
    rng = random.SystemRandom()
    skip = set(unchecked)
    with _lock:
        for _ in range(_TRIES):
            ports = draw(rng)
            if any(p in _reserved for p in ports.values()):
                continue
            if all(port_is_free(p) for name, p in ports.items() if name not in skip):
                _reserved.update(ports.values())
                return ports
    raise RuntimeError("no free port found for the server")


def free_port() -> int:
    """One free loopback port, reserved until released."""
    high = max(10100, ephemeral_low() - 1)
    return reserve_ports(lambda rng: {"port": rng.randrange(10000, high)})["port"]


def release_ports(ports: Iterable[int]) -> None:
    with _lock:
        _reserved.difference_update(ports)
