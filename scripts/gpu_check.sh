#!/usr/bin/env bash
# One command to run first on a machine with a GPU (about 10 minutes on one GPU): the tests
# marked cuda, the demo, a 1-rank NCCL run of the Llama-style model against the unsharded
# model (fp32 and bf16 mixed precision; program, compile=True and interpret), host syncs
# and host-to-device copies per step, peak memory, and two small benches; one table at the
# end (scripts/gpu_check.py). Without CUDA the CUDA rows are marked "skipped (no CUDA)".
# Extra arguments go to the driver: --quick (fewer variants), --device cpu (model rows on
# CPU/gloo, to check the script itself). Exit code 1 when a row failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import autoshard._core" 2>/dev/null; then
    echo "gpu_check: autoshard is not installed; run: bash scripts/setup.sh" >&2
    exit 2
fi
exec python3 scripts/gpu_check.py "$@"
