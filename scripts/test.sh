#!/usr/bin/env bash
# The test command: installs everything into .venv, then lints, type-checks and runs the tests
# (which start their own local S3 server). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check concurrent_loader tests benchmarks examples
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
