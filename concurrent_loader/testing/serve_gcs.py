"""``python -m concurrent_loader.testing.serve_gcs``: a local GCS (fake-gcs-server) until
Ctrl-C or SIGTERM, printing the ``export STORAGE_EMULATOR_HOST=...`` line that points this
library (and Google's) at it; ``--bucket`` creates buckets, ``--data-dir`` keeps objects."""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from .gcs_server import FakeGcsServer

__all__ = ["main"]


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run a fake-gcs-server until Ctrl-C or SIGTERM; print its ``export`` line."""
    parser = argparse.ArgumentParser(prog="python -m concurrent_loader.testing.serve_gcs")
    parser.add_argument("--bucket", action="append", default=[], help="create it")
    parser.add_argument("--data-dir", default=None, help="keep objects here (default: memory)")
    parser.add_argument("--port", type=int, default=None, help="default: a free one")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        with FakeGcsServer(data_dir=args.data_dir, port=args.port) as server:
            for bucket in args.bucket:
                server.create_bucket(bucket)
            print(f"# fake-gcs-server pid {server.pid}; Ctrl-C to stop", flush=True)
            for name, value in server.env().items():
                print(f"export {name}={value}", flush=True)
            status = server.wait()
        print(f"# server exited with status {status}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
