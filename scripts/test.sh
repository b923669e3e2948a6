#!/usr/bin/env bash
# The whole test suite: C++ (ctest) then Python (pytest, incl. torchrun/gloo multi-rank tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build/cpp --output-on-failure -j 2
python3 -m pytest -q tests/python "$@"
