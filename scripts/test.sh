#!/usr/bin/env bash
# The whole test suite: the Python import contracts, C++ (ctest), then Python (pytest, incl.
# torchrun/gloo multi-rank tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the Python layer's flow (pyproject.toml [tool.importlinter]): no wrong-way import, no loop
lint-imports
ctest --test-dir build/cpp --output-on-failure -j 2
python3 -m pytest -q --durations=15 tests/python "$@"
