#!/usr/bin/env bash
# The benchmark: installs everything into .venv, starts the embedded local S3 server and the
# latency proxy, and compares loaders (see benchmarks/README or `--help`). Extra arguments go
# to the harness, e.g. `scripts/bench.sh --images 5000 --repeats 5`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m benchmarks "$@"
