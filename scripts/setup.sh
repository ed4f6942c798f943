#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its development pins.
# Re-running is cheap: nothing is reinstalled unless requirements-dev.txt or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=.venv/.installed-$(cat requirements-dev.txt pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  # torch first, alone, so the pinned CPU build is what every later requirement sees.
  .venv/bin/python -m pip install -q "$(grep -E '^torch==' requirements-dev.txt)"
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  # LitData for the shard benchmark's peers, without its torchvision (a CUDA build that
  # does not load against the CPU torch); what it needs at run time is installed above.
  .venv/bin/python -m pip install -q --no-deps litdata==0.2.76
  # The rest (moto[server] and its many dependencies above all) must not have moved torch.
  .venv/bin/python - "$(grep -E '^torch==' requirements-dev.txt | cut -d= -f3)" <<'PY'
import sys

import torch

if torch.__version__.split("+")[0] != sys.argv[1]:
    sys.exit(f"torch {torch.__version__} is installed, requirements-dev.txt pins {sys.argv[1]}")
PY
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# Azurite, the Azure Blob Storage emulator the Azure tests run (Node >= 20), kept in .bench/;
# without npm the Azure end-to-end tests skip, saying so.
if [ ! -x .bench/node/node_modules/.bin/azurite-blob ]; then
  if command -v npm >/dev/null; then
    npm install --prefix .bench/node azurite@3.37.0
  else
    echo "setup.sh: npm not found: Azurite not installed, the Azure tests will skip" >&2
  fi
fi
