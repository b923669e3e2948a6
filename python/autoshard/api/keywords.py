"""AutoParallel's constructor and backend keywords, mapped onto what autoshard does.

Each keyword is accepted with the values autoshard honours; a value it cannot honour is
refused with the reason and the workaround, never silently ignored
(docs/autoparallel_compat.md lists them).
"""

from __future__ import annotations

import logging
from typing import Any, Callable


def check_autoparallel_keywords(
    *,
    reshard_after_forward: bool | None = None,
    dynamic: bool = False,
    cost_model: Any = "nccl",
    repeated_subgraphs: bool = True,
    hardware: Any = None,
) -> Any:
    """Validates AutoParallel's keywords; returns the ``hardware`` to plan with."""
    if dynamic not in (False, True, None):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    # dynamic=True: calls may change input sizes; each new input shape gets its own step,
    # traced, planned and lowered on first use (modes.py), parameters staying in place
    if reshard_after_forward not in (None, False):
        raise NotImplementedError(
            "autoshard: reshard_after_forward=True (all-gather parameters again in the "
            "backward, ZeRO-3 style) is not a switch here: the planner reshards a block "
            "after the forward where the memory limit needs it (recompute='auto', "
            "memory_limit_bytes=BYTES; docs/cost_model.md 6b) and keeps each gathered "
            "parameter otherwise (ZeRO-2 style). Pass reshard_after_forward=False or leave it out"
        )
    if not isinstance(repeated_subgraphs, bool):
        raise TypeError(f"repeated_subgraphs must be True or False, got {repeated_subgraphs!r}")
    # repeated_subgraphs=True lets identical layers share one strategy, as AutoParallel's
    # ILP does; autoshard ties them where planning each on its own would be large
    # (repeated_layers="auto"); False plans every layer on its own ("untie").
    if cost_model in ("nccl", None):
        return hardware  # autoshard's collective model for the hardware profile
    raise ValueError(
        f"autoshard: cost_model={cost_model!r} is not supported: autoshard costs collectives "
        "with its own NCCL-style model of the hardware profile (docs/cost_model.md). Pass "
        "cost_model='nccl' (or leave it out) and choose the device with hardware='H100' / "
        "'A100' / 'CPU' / ..., or a JSON object of profile fields for another topology"
    )


# AutoParallel's activation checkpointing is a pass over the planned graph: it marks forward
# nodes for recomputation, in stages of ac_stage_size_in_GiB. autoshard's planner chooses
# recomputation itself, per block, to fit the memory per GPU (docs/cost_model.md 6b), so
# the AC keywords are routed to the planner's recompute mode; what has no counterpart there
# (a stage size) is refused naming what to use.
_RECOMPUTE_KNOBS = (
    "memory_limit_bytes=BYTES on AutoParallel / auto_parallel sets the memory per GPU the "
    "planner recomputes to fit (default: the hardware's memory less 10 %), and "
    "recompute='reshard', 'selective' or 'full' recomputes in every block whatever the limit"
)

log = logging.getLogger("autoshard")

# the planner's recompute modes (PlannerOptions.recompute; None is its default, "auto")
RECOMPUTE_MODES = (None, "auto", "none", "reshard", "selective", "full")


def _check_enable_ac(enable_ac: Any, where: str) -> None:
    if not (enable_ac is None or isinstance(enable_ac, bool)):  # 1 == True, not a bool
        raise TypeError(f"{where}: enable_ac must be True, False or None, got {enable_ac!r}")


def _check_ac_stage_size(ac_stage_size_in_GiB: Any, where: str) -> None:
    """AutoParallel's stage size (GiB of forward values recomputed between two kept ones)
    steers its own pass; the planner has no such stages, its knob is the memory limit."""
    if ac_stage_size_in_GiB in ("auto", None):
        return
    raise NotImplementedError(
        f"{where}: ac_stage_size_in_GiB={ac_stage_size_in_GiB!r} sizes the stages of "
        "AutoParallel's activation-checkpointing pass, which autoshard does not have: its "
        "planner chooses per block what the backward recomputes (docs/cost_model.md 6b). "
        f"{_RECOMPUTE_KNOBS}. Leave ac_stage_size_in_GiB out (or 'auto')"
    )


def recompute_for_enable_ac(
    enable_ac: bool | None, ac_stage_size_in_GiB: Any, recompute: str | None
) -> str | None:
    """``AutoParallel(enable_ac=..., ac_stage_size_in_GiB=...)`` (AutoParallel's keywords
    for its activation checkpointing) as the planner's ``recompute`` mode: True lets the
    planner recompute what the memory limit needs ("auto"), False recomputes nothing
    ("none"); None leaves ``recompute`` as given. A ``recompute`` that contradicts
    ``enable_ac`` is refused rather than one of them silently winning."""
    where = "AutoParallel"
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(
            f"{where}: recompute must be one of {', '.join(map(repr, RECOMPUTE_MODES))}, got "
            f"{recompute!r} (docs/cost_model.md 6b)"
        )
    _check_enable_ac(enable_ac, where)
    _check_ac_stage_size(ac_stage_size_in_GiB, where)
    if enable_ac is None:
        return recompute
    routed = "auto" if enable_ac else "none"
    if recompute is None or recompute == routed:
        return routed
    if enable_ac and recompute in ("reshard", "selective", "full"):
        return recompute  # recomputation asked for in every block: AC all the more
    meaning = "recomputes what the memory limit needs" if enable_ac else "recomputes nothing"
    raise ValueError(
        f"AutoParallel(enable_ac={enable_ac}, recompute={recompute!r}) contradict each other: "
        f"enable_ac={enable_ac} means recompute={routed!r} (the planner {meaning}). Pass "
        "only one of them"
    )


def autoparallel_backend(
    *,
    enable_ac: bool | None = None,
    ac_stage_size_in_GiB: Any = "auto",
    overlap_scheduling: bool | None = None,
) -> Callable:
    """A ``torch.compile`` backend for a module autoshard built, as AutoParallel's
    ``autoparallel_backend``: ``torch.compile(parallel, backend=autoparallel_backend())``.

    The module's program is already lowered, bucketed and overlapped (program/lowering.py,
    overlap.py) when it is materialised, so the backend is inductor's ``compile_fx``.
    ``overlap_scheduling`` may only be True (the program's own schedule) or left out.
    ``enable_ac``: the compiled program recomputes what its plan chose when it was planned
    (AutoParallel's ``enable_ac=`` / ``recompute=`` and ``memory_limit_bytes=``); the
    backend adds no pass of its own, so True and False are both accepted and logged with
    where recomputation is set. A stage size (``ac_stage_size_in_GiB=2.0``) is refused."""
    where = "autoparallel_backend"
    _check_enable_ac(enable_ac, where)
    _check_ac_stage_size(ac_stage_size_in_GiB, where)
    if enable_ac is not None:
        # AutoParallel's default is enable_ac=True: said once per backend, at info level,
        # so that a user who counts on it (or on False) knows where the choice is made
        log.info(
            "autoparallel_backend(enable_ac=%s): the compiled program recomputes what its "
            "plan chose; set recomputation when planning: AutoParallel(enable_ac=...) or "
            "recompute=, with memory_limit_bytes=",
            enable_ac,
        )
    if overlap_scheduling not in (None, True):
        raise NotImplementedError(
            "autoparallel_backend(overlap_scheduling=False): the lowered program's "
            "collectives are already bucketed and overlapped (overlap.py); build the module "
            "with compile=False and runtime='interpret' for a step without overlap"
        )

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    backend.__name__ = "autoshard_inductor"
    return backend


class ParallelJoint:
    """``AutoParallel.joint_with_descriptors`` after apply_placement: AutoParallel swaps the
    parallel graph into it, so its ``graph_module`` is the lowered step (``parallel_gm``);
    every other attribute (``params_spec``, ``buffers_spec``, ``_aot_state``, ...) is the
    trace's JointWithDescriptors, fetched on first use (a deep model's full trace costs
    seconds)."""

    def __init__(self, parallel_gm: Callable[[], Any], traced: Callable[[], Any]):
        self._parallel_gm = parallel_gm
        self._traced = traced

    @property
    def graph_module(self):
        return self._parallel_gm()

    def __getattr__(self, name: str):
        return getattr(self._traced(), name)
