"""Measuring what a parallel module holds over one training step on this rank, to set beside
the planner's prediction (the plan's ``summary.memory``, docs/cost_model.md 6).

The peak is torch's own ``MemTracker`` (torch.distributed._tools.mem_tracker): a dispatch
mode that follows every storage the step makes until it is freed, plus the module's
parameters, buffers and the inputs it is given, which exist before the step. It works on
any device, CPU included, where the allocator keeps no statistics. The saved bytes are the
program's own count (``ProgramRunState.saved_bytes``), made while the probe runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker

from autoshard.runtime.module_runtime import runtime_of


@dataclass(frozen=True)
class MeasuredMemory:
    peak_bytes: int  # the most bytes live at once: parameters, buffers, inputs and the step's
    saved_bytes: int  # forward values the program kept for the backward

    def against(self, predicted_peak: int, predicted_saved: int) -> dict[str, float]:
        """measured / predicted for the peak and the saved bytes."""
        return {
            "peak": self.peak_bytes / max(1, predicted_peak),
            "saved": self.saved_bytes / max(1, predicted_saved),
        }


def measure_step_memory(
    module: nn.Module, step: Callable[[], None], inputs: tuple = ()
) -> MeasuredMemory:
    """Runs ``step()`` (a forward and backward of ``module``, a parallel module) once under
    torch's memory tracker; ``inputs``: the tensors the step is fed, counted as held."""
    run_state = runtime_of(module).main.run_state
    tracker = MemTracker()
    tracker.track_external(module, *(t for t in inputs if isinstance(t, torch.Tensor)))
    run_state.count_saved = True
    try:
        with tracker:
            step()
    finally:
        run_state.count_saved = False
    peak = tracker.get_tracker_snapshot("peak")
    total = max((by_kind.get("Total", 0) for by_kind in peak.values()), default=0)
    return MeasuredMemory(peak_bytes=int(total), saved_bytes=run_state.saved_bytes)
