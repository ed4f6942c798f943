#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): one unattended command on a bare CUDA machine,
# figures into one folder. Usage:
#   scripts/gpu_check.sh wheels            # here, with a package index: fetch the wheels a bare
#                                          # GPU machine lacks into .bench/wheels (anycrc, ~0.5 MB)
#   scripts/gpu_check.sh [--out DIR] ...   # there: install those wheels if needed, run the check
#   scripts/gpu_check.sh --dry-run --out DIR   # the same code on the CPU at toy sizes (CI)
# The machine needs Python 3.12 with torch (CUDA), torchvision, Pillow, NumPy and aiohttp.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.bench/wheels
if [[ "${1:-}" == wheels ]]; then
    mkdir -p "$WHEELS"
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" "anycrc==2.1.0"
    du -sh "$WHEELS"
    exit 0
fi
PY=python3
[[ -x .venv/bin/python ]] && PY=.venv/bin/python
if ! "$PY" -c "import anycrc" 2>/dev/null; then
    compgen -G "$WHEELS/*.whl" >/dev/null || { echo "anycrc is missing: run '$0 wheels' first" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-check-site "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$PY" -m benchmarks.gpu_check "$@"
