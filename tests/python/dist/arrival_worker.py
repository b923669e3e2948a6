"""torchrun worker (2 gloo ranks): the arrival check before planning, on real processes.

Usage: torchrun --standalone --nproc-per-node 2 arrival_worker.py KIND TIMEOUT_S OUT_DIR
KIND "never": rank 1 never reaches the check (it sleeps until torchrun ends it); rank 0 must
stop within TIMEOUT_S naming rank 1, print the error and exit 3, which makes torchrun end
the job: the job fails with a message instead of hanging.
KIND "late": rank 1 reaches the check 2 s after rank 0 gave up; both write
OUT_DIR/rank<r>.json with their error and exit 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

from autoshard.planning.rank_agreement import RankTimeoutError, wait_for_all_ranks


def main() -> int:
    kind, timeout_s, out_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(600.0 if kind == "never" else timeout_s + 2.0)
    t0 = time.monotonic()
    try:
        wait_for_all_ranks(timeout_s)
        result = {"ok": True}
    except RankTimeoutError as e:
        result = {"ok": False, "error": str(e)}
    result["seconds"] = time.monotonic() - t0
    if kind == "never":
        print(f"rank {rank}: {result.get('error')} ({result['seconds']:.1f} s)", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3 if not result["ok"] else 0)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)  # rank 0 gave up: no clean group teardown to wait for


if __name__ == "__main__":
    sys.exit(main())
