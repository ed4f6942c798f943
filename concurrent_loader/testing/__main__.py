"""Command line for the testing tools.

``python -m concurrent_loader.testing serve`` starts a :class:`LocalS3Server`, prints its
endpoint and credentials as ``export`` lines (``eval``-able in a shell) and runs until
Ctrl-C or SIGTERM, then stops it and cleans up.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from .proxy.cli import parse_cpus
from .server import LocalS3Server


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve(args: argparse.Namespace) -> int:
    server = LocalS3Server(
        data_dir=args.data_dir,
        port=args.port,
        cpus=args.cpus,
        access_key=args.access_key,
        secret_key=args.secret_key,
    )
    # SIGTERM cleans up like Ctrl-C; SIGINT is set too, as a shell starting us in the
    # background hands it down ignored.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        with server:
            for bucket in args.bucket:
                server.create_bucket(bucket)
            print(
                f"# S3 endpoint {server.endpoint_url} (pid {server.pid}, "
                f"data in {server.data_dir}); Ctrl-C to stop",
                flush=True,
            )
            for name, value in server.env().items():
                print(f"export {name}={value}", flush=True)
            status = server.wait()
        print(f"# server exited with status {status}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m concurrent_loader.testing")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run a local S3 server until Ctrl-C")
    serve_parser.add_argument("--port", type=int, default=None, help="S3 port (default: free)")
    serve_parser.add_argument("--data-dir", default=None, help="kept after exit (default: temp)")
    serve_parser.add_argument("--bucket", action="append", default=[], help="create it")
    serve_parser.add_argument("--access-key", default=None, help="default: random")
    serve_parser.add_argument("--secret-key", default=None, help="default: random")
    serve_parser.add_argument("--cpus", type=parse_cpus, default=None, help="e.g. 0,2-3")
    serve_parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
