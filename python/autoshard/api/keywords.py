"""AutoParallel's constructor and backend keywords, mapped onto what autoshard does.

Each keyword is accepted with the values autoshard honours; a value it cannot honour is
refused with the reason and the workaround, never silently ignored
(docs/autoparallel_compat.md lists them).
"""

from __future__ import annotations

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


# what a user asking for AutoParallel's activation checkpointing uses instead: the planner
# chooses recomputation itself; torch.utils.checkpoint is named so that nobody counts on it:
# it traces, but autoshard's program follows the plan's recomputation, not the region's
_INSTEAD_OF_AC = (
    "the planner chooses what the backward recomputes, per block, to fit the memory per "
    "GPU (docs/cost_model.md 6b): memory_limit_bytes=BYTES on AutoParallel / auto_parallel "
    "sets the limit (default: the hardware's memory less 10 %), and recompute='selective' "
    "or 'full' asks for it in every block. torch.utils.checkpoint in the model traces and "
    "runs, but only the plan's recomputation happens."
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
    ``overlap_scheduling`` may only be True (the program's own schedule) or left out;
    ``enable_ac`` (AutoParallel's activation-checkpointing pass) may only be False or left
    out: autoshard keeps the forward's activations for the backward."""
    if enable_ac not in (None, False):
        raise NotImplementedError(
            "autoparallel_backend(enable_ac=True): autoshard has no activation-checkpointing "
            f"pass after planning: {_INSTEAD_OF_AC} Pass enable_ac=False (or leave it out)"
        )
    if ac_stage_size_in_GiB not in ("auto", None):
        raise NotImplementedError(
            "autoparallel_backend(ac_stage_size_in_GiB=...) configures activation "
            f"checkpointing after planning, which autoshard does not do: {_INSTEAD_OF_AC} Leave "
            "ac_stage_size_in_GiB out"
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
