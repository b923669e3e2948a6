#!/usr/bin/env bash
# One-time set-up of a fresh machine, safe to run again: system packages, torch (CPU build),
# the autoshard package (C++ core + extension), and a C++ build for ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

# libisal-dev: ISA-L's igzip inflates gzip problem files (zlib1g-dev: the tests write them);
# nlohmann-json3-dev, rapidjson-dev, libcli11-dev, libfmt-dev: the C++ core's file formats (rapidjson:
# the event reader of large problem files), command line and output formatting; chromium: headless rendering of `autoshard view` pages in tests/python/test_plan_view.py
need_apt=0
for pkg in libgtest-dev zlib1g-dev libisal-dev nlohmann-json3-dev rapidjson-dev libcli11-dev libfmt-dev cmake g++ chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq libgtest-dev zlib1g-dev libisal-dev nlohmann-json3-dev rapidjson-dev libcli11-dev libfmt-dev cmake g++ chromium >/dev/null
fi

python3 -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null \
  || pip install -q torch==2.13.0
python3 -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.0" pytest numpy transformers \
  matplotlib tqdm import-linter
# torchtitan's model code (its FlexAttention models are planned and trained by
# tests/python/test_torchtitan*.py): the package without its dependencies, which would replace
# torch; triton only for its imports (the CPU runs never call it); spmd_types, tyro and einops
# are what its model code imports.
python3 -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('torchtitan') == '0.3.0' else 1)" 2>/dev/null \
  || python3 -m pip install -q --no-deps torchtitan==0.3.0 spmd_types==0.2.3 triton==3.9.0
python3 -m pip install -q tyro einops
# HiGHS (the C++ solver's MILP) as a static library under build/highs, once.
bash scripts/build_highs.sh
# No build isolation: the build tools are installed above, and isolation would download them.
python3 -m pip install -q --no-build-isolation -e . 

cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/cpp -j 2
