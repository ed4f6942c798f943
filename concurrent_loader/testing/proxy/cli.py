"""The proxy process: command line, startup and shutdown.

``python -m concurrent_loader.testing.proxy --help`` lists the flags. Once listening, the
process prints one JSON line on stdout (``{"ready": true, "endpoint_url": ..., "port":
..., "pid": ...}``) and then serves until SIGTERM or SIGINT (or, with
``--exit-on-stdin-eof``, until its stdin closes). Invalid flags exit with status 2
before anything listens.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence

from .faults import FaultPlan
from .latency import LATENCY_PRESETS, LatencyModel
from .server import ProxyServer

__all__ = ["build_parser", "main", "parse_cpus", "proxy_from_args"]


def parse_cpus(text: str) -> set[int]:
    """A CPU list such as ``0,2-3`` as a set of ids."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m concurrent_loader.testing.proxy",
        description="HTTP/1.1 reverse proxy adding latency, bandwidth caps and faults "
        "in front of an S3-compatible server. Prints one JSON ready line on stdout.",
    )
    parser.add_argument("--upstream", required=True, help="http://host:port of the server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    latency = parser.add_argument_group(
        "latency",
        "fixed (--latency-ms, --jitter-ms) or lognormal (--latency-p50-ms, "
        "--latency-p99-ms), plus stragglers; explicit flags override the preset's values",
    )
    latency.add_argument("--preset", choices=sorted(LATENCY_PRESETS), default=None)
    for field in dataclasses.fields(LatencyModel):
        # None: not given, so the preset's (or the model's default) value holds.
        latency.add_argument("--" + field.name.replace("_", "-"), type=float, default=None)
    bandwidth = parser.add_argument_group("bandwidth caps", "bytes per second sent to clients")
    bandwidth.add_argument("--bandwidth-bytes-per-s", type=float, default=None, help="each")
    bandwidth.add_argument("--total-bandwidth", type=float, default=None, help="all together")
    faults = parser.add_argument_group("faults", "rates are probabilities per request")
    faults.add_argument("--seed", type=int, default=0, help="also seeds the latency draws")
    defaults = FaultPlan()
    for field in dataclasses.fields(FaultPlan):
        if field.name in ("seed", "faults_on"):
            continue
        default = getattr(defaults, field.name)
        kind = str if isinstance(default, str) else float
        faults.add_argument("--" + field.name.replace("_", "-"), type=kind, default=default)
    faults.add_argument("--faults-on", default="GET", help="comma-separated HTTP methods")
    parser.add_argument("--cpus", type=parse_cpus, default=None, help="e.g. 0,2-3")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop when stdin closes (so the proxy dies with the process that started it)",
    )
    return parser


def proxy_from_args(args: argparse.Namespace) -> ProxyServer:
    """The proxy the parsed flags describe; ValueError for invalid values."""
    fault_fields = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(FaultPlan)
        if f.name not in ("seed", "faults_on")
    }
    plan = FaultPlan(seed=args.seed, faults_on=tuple(args.faults_on.split(",")), **fault_fields)
    latency = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(LatencyModel)
        if getattr(args, f.name) is not None
    }
    return ProxyServer(
        args.upstream,
        preset=args.preset,
        **latency,
        bandwidth_bytes_per_s=args.bandwidth_bytes_per_s,
        total_bandwidth=args.total_bandwidth,
        faults=plan,
    )


async def _serve(args: argparse.Namespace, proxy: ProxyServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if args.exit_on_stdin_eof:

        def on_stdin() -> None:
            if not os.read(0, 4096):
                loop.remove_reader(0)
                stop.set()

        loop.add_reader(0, on_stdin)
    port = await proxy.start(args.host, args.port)
    ready = {
        "ready": True,
        "endpoint_url": f"http://{args.host}:{port}",
        "port": port,
        "pid": os.getpid(),
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await proxy.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until SIGTERM or SIGINT."""
    args = build_parser().parse_args(argv)
    if args.cpus:
        # Before the loop starts any thread, so every thread inherits the mask.
        os.sched_setaffinity(0, args.cpus)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s proxy %(levelname)s %(message)s",
    )
    try:
        proxy = proxy_from_args(args)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_serve(args, proxy))
    finally:
        loop.close()
    return 0
