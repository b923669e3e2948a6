#!/usr/bin/env python3
"""Peak memory and step time of autoshard's plan against FSDP2 with activation
checkpointing written by hand, side by side on the same model, global batch and ranks:
FSDP2 alone, FSDP2 with every block checkpointed (full), and FSDP2 with selective
checkpointing (matmul and attention outputs saved, the rest recomputed: torchtitan's "op"
policy). Each variant's peak is measured over one step with torch's MemTracker; autoshard's
row adds the planner's prediction. The model and harness are bench/step_time.py's; any of its
options can be given.

    python3 bench/memory.py                          # dim 128, 2 layers, 4 ranks
    python3 bench/memory.py --dim 256 --layers 4 --seq 256
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import step_time  # noqa: E402

DEFAULTS = ["--ranks", "4", "--variants", "autoshard,fsdp2,fsdp2_ac,fsdp2_sac", "--memory"]

if __name__ == "__main__":
    sys.argv[1:1] = DEFAULTS  # options given on the command line come later and win
    step_time.main()
