"""How a parallel module runs its plan: one typed object, read by the runtime only.

``RuntimeOptions`` is to the runtime what ``PlannerOptions`` (planning/options.py) is to the
planner. ``build_parallel_module`` takes the fields as keywords (the API passes what the
user gave ``AutoParallel`` / ``auto_parallel``) and checks them here, once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

PROGRAM = "program"
INTERPRET = "interpret"
EXECUTORS = (PROGRAM, INTERPRET)


@dataclass(frozen=True)
class RuntimeOptions:
    # how the step runs (executors.py): PROGRAM, this rank's forward and backward lowered
    # once to plain ATen graphs with explicit, overlapped collectives (program/); or
    # INTERPRET, the reference interpreter running the joint graph as DTensor ops node by
    # node (program/interpreter.py), slower, the ground truth the program is tested against
    executor: str = PROGRAM
    # compile the lowered program with inductor (PROGRAM only)
    compile: bool = False
    # overlap.py's limits: bytes of gathered parameters prefetched ahead of their use, and
    # bytes per gather / reduction bucket (0: one collective per tensor, as traced);
    # None: overlap.py's defaults
    prefetch_bytes: int | None = None
    bucket_bytes: int | None = None
    # raise when DTensor's own layout for a node differs from the plan's, instead of
    # redistributing to the plan's layout and recording a warning (tests, debugging)
    strict: bool = False
    # how the steps of other modes (eval, no-grad; modes.py) are traced, as the training
    # step was: "direct" (make_fx) or "dynamo" (source lines kept; trace/tracer.py checks it)
    capture: str = "direct"
    # the mixed-precision policy those steps are traced with (trace/mixed_precision.py)
    mp_policy: Any = None
    # calls whose input sizes differ from the traced ones get a step of their own per input
    # shape (modes.py) instead of an error
    dynamic: bool = False

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"runtime must be one of {EXECUTORS}, got {self.executor!r}")
        if self.compile and self.executor != PROGRAM:
            raise ValueError("compile=True compiles the lowered program: use runtime='program'")
        for name in ("prefetch_bytes", "bucket_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be None or an int >= 0, got {value!r}")

    @property
    def runs_program(self) -> bool:
        return self.executor == PROGRAM

    def replace(self, **changes: Any) -> "RuntimeOptions":
        return dataclasses.replace(self, **changes)
