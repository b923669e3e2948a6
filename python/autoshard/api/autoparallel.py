"""The AutoParallel-compatible API.

    with AutoParallel(model, input_fn, mesh) as autop:
        autop.add_parameter_memory_constraint(low=None, high=None)
        autop.add_input_constraints([(Shard(0), Replicate())])
        autop.add_output_constraints([(Replicate(), Replicate())])
        plan = autop.optimize_placement(verbose=True)
        parallel = autop.apply_placement(plan)

and the one-call form ``auto_parallel(model, mesh, sample_inputs=..., ...)``. The model is
traced (autoshard.trace.tracer), planned by the C++ core (``_core.plan_graph``) and returned as a
module whose parameters are DTensors (autoshard.runtime.parallel_module).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import Placement

from autoshard.api.keywords import (
    ParallelJoint,
    check_autoparallel_keywords,
    recompute_for_enable_ac,
)
from autoshard.planning.hardware import planner_fp32_precision
from autoshard.planning.options import DEFAULT_BUDGET, DEFAULT_TIME_LIMIT_S, PlannerOptions
from autoshard.placements import layout_to_strs, normalize_placements
from autoshard.planning.presets import apply_preset, check_auto_parallel_args, check_preset
from autoshard.planning.rank_agreement import DEFAULT_TIMEOUT_S
from autoshard.api.sharding_optimizer import ShardingOptimizer
from autoshard.trace.traced_step import ForwardInputs, TracedStep
from autoshard.planning.planner import (
    cache_and_key,
    default_hardware,
    log_plan,
    measured_hardware,
    mesh_trace_device,
    plan_traced_step,
    same_plan_on_every_rank,
)
from autoshard.trace.load_balance import load_balance_for
from autoshard.trace.tracer import trace_training_step

log = logging.getLogger("autoshard")

_NOT_ENTERED = (
    "You must use AutoParallel as a context manager: "
    "`with AutoParallel(model, input_fn, mesh) as autop: ...`"
)


class AutoParallel:
    """Trace a model's training step, plan its sharding on ``mesh`` and build the parallel
    module. ``input_fn()`` returns the GLOBAL example inputs (a tensor, a tuple of them or
    ``ForwardInputs``); it runs under a fake tensor mode, so sizes cost nothing.
    ``hardware`` names the cost model's device profile ("H100", "A100", "CPU", ...), is a
    JSON object of profile fields, or "measure" (CPU ranks on a real process group: matmul,
    op and collective figures measured on the group before planning, calibrate.py); None
    picks it from the mesh and, on a GPU host, the GPU's name (default_hardware,
    hardware.py). Float32 matmuls are priced as torch runs them here: TF32 when
    ``torch.backends.cuda.matmul.fp32_precision`` is "tf32", full float32 otherwise.
    ``rank_timeout_s``: on a real multi-rank process group, how long each rank waits for the
    others to reach planning before raising an error naming the missing ranks (ranks then
    check that they trace the same model with the same constraints and options).
    ``preset``: "ddp", "fsdp", "hsdp", "tp" or "fsdp+tp" adds that preset's input layouts and
    parameter memory bounds after tracing (presets.py, docs/presets.md); the mesh must fit it
    (dim names), and add_input_constraints is then not called.
    AutoParallel's keywords ``reshard_after_forward``, ``dynamic``, ``cost_model`` and
    ``repeated_subgraphs`` are accepted with the values autoshard can honour; any other value
    is refused with the reason (api/keywords.py, docs/autoparallel_compat.md).
    ``repeated_layers``: identical repeated layers (``layers.0 .. layers.N-1``) are "tie"d
    (one layer priced, every copy takes its strategies: planning time and memory stop growing
    with depth), "untie"d (each layer planned on its own) or, by default ("auto"), tied only
    where planning each layer on its own would be large (docs/repeated_layers.md).
    ``repeated_subgraphs=False`` means "untie".
    ``recompute``: what the backward recomputes to fit ``memory_limit_bytes`` (else the
    hardware's memory less 10 %): "auto" (default: what the limit needs), "none",
    "reshard" (every block gathers its gathered weights and activations again in the
    backward instead of keeping them: FSDP2's reshard after forward), "selective", "full"
    (docs/cost_model.md 6b). AutoParallel's ``enable_ac=True`` is
    "auto", ``enable_ac=False`` "none"; a stage size ``ac_stage_size_in_GiB`` is refused.
    ``dynamic=True``: the parallel module accepts inputs whose sizes differ from the
    example's (same number of dims and dtypes); each new input shape gets its own step,
    traced, planned (parameters pinned to their layouts) and lowered on first use, and
    cached (modes.py). Without it a different input shape is an error.
    ``time_limit_s`` caps planning (default 20 s); ``gap_tolerance`` (default 0.001) stops the
    solver once its plan is within that fraction of its proven lower bound (0: only a proof of
    optimality stops it before the time limit).
    ``cp_load_balance``: context parallelism on a mesh dim named "cp" stores the sequence
    (dim 1 of the inputs) in head-tail order, so that causal attention's work is the same on
    every cp rank (trace/load_balance.py, docs/context_parallel.md). None (default): on where
    the mesh has a "cp" dim of size > 1, falling back to the contiguous split with a warning
    where the sequence does not divide by 2 x cp; True: on, and such a sequence is an error;
    False: off (the contiguous split).
    ``plan_cache``: plans are cached on disk by graph, mesh, constraints, hardware and
    options (plan_cache.py): True (default) uses ``$AUTOSHARD_CACHE_DIR`` or
    ``~/.cache/autoshard/plans``, a path uses that folder, False turns the cache off."""

    def __init__(
        self,
        model: nn.Module,
        input_fn: Callable[[], Any] | Any,
        mesh: DeviceMesh,
        mp_policy: Any = None,
        reshard_after_forward: bool | None = None,
        dynamic: bool = False,
        cost_model: Any = "nccl",
        repeated_subgraphs: bool = True,
        *,
        hardware: Any = None,
        strict: bool = False,
        time_limit_s: float | None = None,
        memory_limit_bytes: int | None = None,
        capture: str = "dynamo",
        compile: bool = False,
        runtime: str = "program",
        rank_timeout_s: float = DEFAULT_TIMEOUT_S,
        preset: str | None = None,
        gap_tolerance: float | None = None,
        plan_cache: Any = True,
        repeated_layers: str | None = None,
        recompute: str | None = None,
        optimizer: str | None = None,
        enable_ac: bool | None = None,
        ac_stage_size_in_GiB: Any = "auto",
        cp_load_balance: bool | None = None,
    ):
        from autoshard.trace.mixed_precision import canonical_policy
        from autoshard.planning.plan_cache import PlanCache

        hardware = check_autoparallel_keywords(
            reshard_after_forward=reshard_after_forward,
            dynamic=dynamic,
            cost_model=cost_model,
            repeated_subgraphs=repeated_subgraphs,
            hardware=hardware,
        )
        self.reshard_after_forward = reshard_after_forward
        self.dynamic = dynamic
        self.cost_model = cost_model
        self.repeated_subgraphs = repeated_subgraphs
        if repeated_layers not in (None, "auto", "tie", "untie"):
            raise ValueError(
                f"repeated_layers must be 'auto', 'tie' or 'untie', got " f"{repeated_layers!r}"
            )
        if repeated_layers is None:
            repeated_layers = "auto" if repeated_subgraphs else "untie"
        self.repeated_layers = repeated_layers
        # what the backward recomputes to fit memory_limit_bytes (else the hardware's
        # memory less 10 %): "auto" (only what the limit needs; the default), "none",
        # "reshard", "selective", "full" (PlannerOptions.recompute). AutoParallel's activation
        # checkpointing keywords (older versions take them here) are routed to it:
        # enable_ac=True -> "auto", False -> "none" (keywords.py)
        self.recompute = recompute_for_enable_ac(enable_ac, ac_stage_size_in_GiB, recompute)
        self.enable_ac = enable_ac
        # the optimizer whose state the memory per GPU counts against the limit: "adam" (the
        # default; AdamW too), "sgd" (no state), "sgd_momentum" (PlannerOptions.optimizer)
        self.optimizer = optimizer
        # FSDP2's MixedPrecisionPolicy: parameters cast to param_dtype in the traced step,
        # all-gathers in param_dtype, gradient reductions in reduce_dtype (mixed_precision.py)
        self.mp_policy = canonical_policy(mp_policy)
        if not isinstance(mesh, DeviceMesh):
            raise TypeError(
                f"mesh must be a torch.distributed DeviceMesh, got " f"{type(mesh).__name__}"
            )
        self._source_model = model  # traced and parallelised; ``model`` is a fake copy
        self._fake_model: nn.Module | None = None
        self.input_fn = input_fn
        self.mesh = mesh
        self.hardware = hardware if hardware is not None else default_hardware(mesh)
        self.strict = strict
        self.time_limit_s = time_limit_s
        if gap_tolerance is not None and not 0.0 <= float(gap_tolerance) < 1.0:
            raise ValueError(
                f"gap_tolerance must be a fraction in [0, 1) (e.g. 0.001 for "
                f"0.1 %, 0 to ask for a proof of optimality), got "
                f"{gap_tolerance!r}"
            )
        self.gap_tolerance = None if gap_tolerance is None else float(gap_tolerance)
        PlanCache.resolve(plan_cache)  # a bad value fails here, not after tracing
        self.plan_cache = plan_cache
        self.memory_limit_bytes = memory_limit_bytes
        self.capture = capture
        # how the parallel module runs its step (parallel_module.py): the lowered per-rank program,
        # compiled with inductor when ``compile``, or the reference DTensor interpreter
        self.compile = compile
        self.runtime = runtime
        if not float(rank_timeout_s) > 0:
            raise ValueError(
                f"rank_timeout_s must be a positive number of seconds, got " f"{rank_timeout_s!r}"
            )
        self.rank_timeout_s = float(rank_timeout_s)
        # "ddp", "fsdp", "hsdp", "tp", "fsdp+tp": input + parameter memory constraints added
        # after tracing (presets.py); checked against the mesh here, before tracing
        self.preset = check_preset(preset, mesh)
        self.cp_load_balance = cp_load_balance
        self._load_balance = load_balance_for(cp_load_balance, mesh.shape, mesh.mesh_dim_names)
        self._ranks_checked = False
        self._state = "new"
        self.step: TracedStep | None = None
        self._param_memory: tuple | None | str = DEFAULT_BUDGET
        self._input_constraints: dict[str, list[str]] = {}
        self._output_constraints: dict[str, list[str]] = {}
        self._node_constraints: dict[str, list[str]] = {}
        self.plan: dict | None = None
        self.parallel_model: nn.Module | None = None
        self._sharding_optimizer = None

    @property
    def model(self) -> nn.Module:
        """The model as AutoParallel holds it: a copy whose parameters and buffers are fake
        tensors (shapes, dtypes, no data; aliases kept), built on first read. autoshard
        traces and parallelises the model you passed, which it never modifies."""
        if self._fake_model is None:
            self._fake_model = _fake_copy(self._source_model)
        return self._fake_model

    # ---- context -------------------------------------------------------------------------
    def __enter__(self) -> "AutoParallel":
        if self._state != "new":
            raise RuntimeError("AutoParallel is not reentrant: create a new one")
        from autoshard import progress
        from autoshard.ops.local_map_collectives import planning_on

        device = mesh_trace_device(self.mesh)
        # planning_on: a local_map region without device_mesh= is declared on this mesh
        with progress.stage("trace", bar=_bar_on_this_rank()), planning_on(self.mesh):
            self.step = trace_training_step(
                self._source_model,
                self.input_fn,
                device,
                capture=self.capture,
                mp_policy=self.mp_policy,
                load_balance=self._load_balance,
            )
        log.info(
            "autoshard: traced %d graph nodes in %.2f s",
            len(self.step.gm.graph.nodes),
            self.step.trace_seconds,
        )
        # with_sharding_constraint(...) calls in the model: pins on their graph nodes
        for name, (layout, where) in self.step.sharding_pins.items():
            if len(layout) != self.mesh.ndim:
                raise ValueError(
                    f"with_sharding_constraint{where}: {len(layout)} placements "
                    f"{layout} for a {self.mesh.ndim}-d mesh (one per mesh dim)"
                )
            self._node_constraints[name] = list(layout)
        try:
            # built here, as AutoParallel does: a failure leaves this object un-entered
            self._sharding_optimizer = ShardingOptimizer(self)
        except BaseException:
            self.step = None
            self._node_constraints.clear()
            raise
        self._state = "entered"
        apply_preset(self, self.preset)
        return self

    def __exit__(self, *exc) -> None:
        self._state = "exited"

    def _check_entered(self) -> None:
        if self._state == "new":
            raise RuntimeError(_NOT_ENTERED)
        if self._state == "exited":
            raise RuntimeError(
                "AutoParallel is not reentrant: its `with` block has ended; "
                "call its methods inside the block"
            )

    @property
    def gm(self):
        """The traced joint forward+backward graph (readable after the ``with`` block too)."""
        if self._state == "new":
            raise RuntimeError(_NOT_ENTERED)
        return self.step.gm

    @property
    def joint_with_descriptors(self):
        """torch's JointWithDescriptors of the trace (``aot_export_joint_with_descriptors``).
        After apply_placement, as AutoParallel's, its ``graph_module`` is the parallel graph
        (``parallel_gm``) and the rest is the trace's (compat.ParallelJoint). A deep model's
        step is extrapolated from 3 of its layers (block_extrapolation.py) and holds none: the first
        read traces every layer once for it (the same graph, node for node)."""
        if self.parallel_model is not None:
            return ParallelJoint(lambda: self.parallel_gm, self._traced_joint_with_descriptors)
        return self._traced_joint_with_descriptors()

    def _traced_joint_with_descriptors(self):
        if self._state == "new":
            raise RuntimeError(_NOT_ENTERED)
        if self.step.joint_with_descriptors is None:
            from autoshard.ops.local_map_collectives import planning_on

            with planning_on(self.mesh):
                full = trace_training_step(
                    self._source_model,
                    self.input_fn,
                    mesh_trace_device(self.mesh),
                    capture=self.capture,
                    mp_policy=self.mp_policy,
                    extrapolate_layers=False,
                    load_balance=self._load_balance,
                )
            self.step.joint_with_descriptors = full.joint_with_descriptors
        return self.step.joint_with_descriptors

    @property
    def sharding_optimizer(self):
        """AutoParallel's ShardingOptimizer methods over this planner (sharding_optimizer.py):
        add_node_constraint, remove_constraints, get_solution, get_json, save / load,
        save_placements / load_placements. After the ``with`` block it still reads, saves
        and loads (graph, prob, get_json, save, save_placements, load_placements); what
        plans again (get_solution / resolve) or edits constraints still needs the block."""
        if self._state == "new":  # readable after the block too (solving checks again)
            raise RuntimeError(_NOT_ENTERED)
        return self._sharding_optimizer

    @property
    def parallel_gm(self):
        """This rank's step as one forward + backward graph, as AutoParallel's: backward
        nodes tagged ``meta["partitioner_tag"] = "is_backward"``, one ``tangents_k``
        placeholder per module output. The module runs it as two graphs,
        ``parallel_model.parallel_gm`` (forward) and ``parallel_model.parallel_bwd_gm``.
        Lowered from the meta state until ``to_empty``, then the program that runs."""
        if self.parallel_model is None:
            raise RuntimeError("parallel_gm exists after apply_placement(): call it first")
        from autoshard.runtime.parallel_module import parallel_joint_gm

        return _with_traced_meta(parallel_joint_gm(self.parallel_model), self.step.gm)

    # ---- constraints ---------------------------------------------------------------------
    def add_parameter_memory_constraint(
        self, low: float | None = None, high: float | None = None
    ) -> None:
        """Each GPU holds between ``low`` and ``high`` of all parameter bytes (defaults 0 and
        1/mesh.size(): FSDP-like; low=high=1: replicated, DDP-like)."""
        self._check_entered()
        n = self.mesh.size()
        lo = 0.0 if low is None else float(low)
        hi = 1.0 / n if high is None else float(high)
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError(
                f"parameter memory constraint needs 0 <= low <= high <= 1, got "
                f"low={lo}, high={hi}"
            )
        if hi < 1.0 / n - 1e-12:
            raise ValueError(
                f"parameter memory constraint high={hi:g} is below 1/mesh.size() = 1/{n} = "
                f"{1.0 / n:g}, the least any plan can store per GPU (every parameter sharded "
                f"over all {n} ranks): use high >= {1.0 / n:g}, or leave it out (the default "
                "is 1/mesh.size(), FSDP-like)"
            )
        self._param_memory = (lo, hi)

    def remove_parameter_memory_constraint(self) -> None:
        self._check_entered()
        self._param_memory = None

    def _layout_strs(self, placements: Sequence[Placement], ndim: int | None, what: str):
        if isinstance(placements, Placement):
            placements = (placements,)
        placements = tuple(placements)
        if len(placements) != self.mesh.ndim:
            raise ValueError(
                f"{what}: expected {self.mesh.ndim} placements (one per mesh "
                f"dim), got {placements!r}"
            )
        for p in placements:
            if not isinstance(p, Placement):
                raise TypeError(
                    f"{what}: {p!r} is not a torch.distributed.tensor placement "
                    "(Shard, Replicate, Partial)"
                )
        if ndim is not None:
            placements = normalize_placements(placements, ndim)
        return layout_to_strs(placements)

    def add_input_constraints(self, constraints: Sequence[Sequence[Placement] | None]) -> None:
        """One placement tuple per forward input (flattened args then kwargs); None leaves
        that input free for the planner."""
        self._check_entered()
        step = self.step
        if self._input_constraints:
            raise RuntimeError("add_input_constraints may only be called once")
        if len(constraints) != len(step.input_nodes):
            raise ValueError(
                f"add_input_constraints: got {len(constraints)} entries, the "
                f"model has {len(step.input_nodes)} inputs"
            )
        for i, (c, name) in enumerate(zip(constraints, step.input_nodes)):
            if c is None or name is None:
                continue
            ndim = len(step.input_metas[i][0])
            self._input_constraints[name] = self._layout_strs(c, ndim, f"input {i}")

    def add_output_constraints(self, constraints: Sequence[Sequence[Placement] | None]) -> None:
        self._check_entered()
        step = self.step
        if self._output_constraints:
            raise RuntimeError("add_output_constraints may only be called once")
        if len(constraints) != step.num_forward_outputs:
            raise ValueError(
                f"add_output_constraints: got {len(constraints)} entries, the "
                f"model has {step.num_forward_outputs} outputs"
            )
        for i, c in enumerate(constraints):
            if c is not None:
                self._output_constraints[str(i)] = self._layout_strs(c, None, f"output {i}")

    def add_node_constraint(
        self, node: str | torch.fx.Node, placements: Sequence[Placement] | None = None
    ) -> None:
        """Pin one graph node's output layout (a node of ``autop.gm`` or its name);
        ``placements=None`` is AutoParallel's default, batch sharding (S(0), R, ...)."""
        self._check_entered()
        name = node.name if isinstance(node, torch.fx.Node) else str(node)
        if name not in self._graph_node_names():
            raise ValueError(f"add_node_constraint: autop.gm has no node named {name!r}")
        name = self._planner_node_name(name)
        if placements is None:
            from torch.distributed.tensor import Shard

            placements = (Shard(0),) + (Replicate(),) * (self.mesh.ndim - 1)
        self._node_constraints[name] = self._layout_strs(placements, None, f"node {name}")

    def _planner_node_name(self, name: str) -> str:
        """The planner node a constraint on ``name`` pins. The planner's graph has no
        getitem nodes (an op's outputs are its own, graph_export.tensor_ref), and a pin holds
        a node's first tensor output: a getitem of that output pins its producer; one of
        another output cannot be pinned, which is said here rather than at planning."""
        import operator

        n = next(x for x in self.step.gm.graph.nodes if x.name == name)
        if n.op != "call_function" or n.target is not operator.getitem:
            return name
        src, idx = n.args
        vals = src.meta.get("val")
        first = (
            next((k for k, v in enumerate(vals) if isinstance(v, torch.Tensor)), None)
            if isinstance(vals, (tuple, list))
            else 0
        )
        if idx != first:
            raise ValueError(
                f"add_node_constraint: {name!r} is output {idx} of {src.name!r} "
                f"({src.target}); a node constraint pins a node's first tensor "
                f"output (output {first}) only. Pin {src.name!r} for that output, or "
                f"pin a node that reads {name!r}"
            )
        return src.name

    def _graph_node_names(self) -> set[str]:
        return {n.name for n in self.step.gm.graph.nodes if n.op != "output"}

    # ---- planning --------------------------------------------------------------------------
    def graph_json(self) -> str:
        """The traced step as the planner's graph JSON (docs/formats.md). A read: it works
        after the ``with`` block too, so the sharding optimizer's save / get_json /
        load_placements do (the traced step and the constraints no longer change)."""
        if self._state == "new":
            raise RuntimeError(_NOT_ENTERED)
        from autoshard.planning.graph_export import graph_json

        return graph_json(self.step, free_outputs=self._free_outputs(), mesh=self.mesh)

    def _free_outputs(self) -> list[int]:
        """Forward outputs without an output constraint: the planner chooses their layout
        (tied to their gradient's, as AutoParallel does) instead of pinning Replicate."""
        return [
            i
            for i in range(self.step.num_forward_outputs)
            if str(i) not in self._output_constraints
        ]

    def options(self, verbose: bool = False) -> PlannerOptions:
        mesh = self.mesh
        return PlannerOptions(
            mesh_shape=list(mesh.shape),
            mesh_dim_names=list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            hardware=self.hardware,
            input_constraints=dict(self._input_constraints),
            output_constraints=dict(self._output_constraints),
            node_constraints=dict(self._node_constraints),
            parameter_memory=self._param_memory,
            time_limit_s=self.time_limit_s,
            gap_tolerance=self.gap_tolerance,
            memory_limit_bytes=self.memory_limit_bytes,
            repeated_layers=self.repeated_layers,
            recompute=self.recompute,
            optimizer=self.optimizer,
            # float32 matmuls priced as this process runs them (TF32 or full float32)
            fp32_matmul_precision=planner_fp32_precision(self.hardware),
            verbose=False,  # the planner's own trace goes to stderr; we log the report
        )

    def optimize_placement(self, verbose: bool = False) -> "PlacementResult":
        """Plan the traced step. Returns AutoParallel's ``{fx.Node: OpSpec}`` dict whose
        ``.plan`` (and string keys) is the plan JSON (docs/formats.md section 3); see
        placement_result.py."""
        from autoshard.api.placement_result import PlacementResult

        self._check_entered()
        t0 = time.perf_counter()
        graph = self.graph_json()
        self._check_ranks_agree(graph)
        self.hardware = measured_hardware(self.hardware, self.mesh)
        from autoshard import progress

        # time_limit_s caps the whole call: the planner gets what the export and the rank
        # agreement left of it (the cache key holds the options as given)
        limit = self.time_limit_s or DEFAULT_TIME_LIMIT_S
        with progress.stage("plan", expected_s=limit, bar=_bar_on_this_rank()):
            plan = same_plan_on_every_rank(
                lambda: plan_traced_step(
                    self.step, self.options(verbose).after(time.perf_counter() - t0), graph
                ),
                *cache_and_key(self.plan_cache, graph, self.options()),
                mesh=self.mesh,
            )
        progress.log_solver_result(plan)
        plan["plan_seconds"] = time.perf_counter() - t0
        if verbose:
            log_plan(plan, self.step)
        self.plan = plan
        return PlacementResult(plan, self.step.gm, self.mesh)

    def apply_placement(self, plan: Any = None) -> nn.Module:
        """The parallel module of ``plan``: what optimize_placement (or
        sharding_optimizer.load_placements) returned, possibly edited, a plan JSON dict, or
        a ``{node: OpSpec}`` dict; default: the last optimize_placement result."""
        self._check_entered()
        from autoshard.runtime.parallel_module import build_parallel_module
        from autoshard.api.placement_result import plan_of

        plan = plan_of(plan) if plan is not None else self.plan
        if plan is None:
            raise RuntimeError(
                "apply_placement needs a plan: call optimize_placement() first " "or pass one"
            )
        if not self._ranks_checked:  # a plan of the user's own: it must agree across ranks
            self._check_ranks_agree(self.graph_json(), plan)
        self.hardware = measured_hardware(self.hardware, self.mesh)  # for other modes' plans
        self.parallel_model = build_parallel_module(
            self._source_model,
            self.step,
            plan,
            self.mesh,
            strict=self.strict,
            runtime=self.runtime,
            compile=self.compile,
            variant_planner=self._variant_planner(),
            capture=self.capture,
            mp_policy=self.mp_policy,
            dynamic=bool(self.dynamic),
            free_outputs=[i for i in self._free_outputs() if i in self.step.tangent_of.values()],
        )
        return self.parallel_model

    def _apply_placement_common(self, plan: Any = None) -> nn.Module:
        """AutoParallel's internal first half of apply_placement (the parallel graph and the
        sharded parameters), which its users' scripts call to read ``parallel_gm`` without
        the module: here the same as apply_placement."""
        return self.apply_placement(plan)

    def _check_ranks_agree(self, graph: str, plan: dict | None = None) -> None:
        """Every rank must be here (within rank_timeout_s) and plan the same step
        (rank_agreement.py); a no-op on one rank or a fake process group."""
        from autoshard.planning.rank_agreement import check_ranks_agree

        opts = self.options()
        mesh = {
            "shape": list(self.mesh.shape),
            "dim_names": opts.mesh_dim_names,
            "device_type": self.mesh.device_type,
            "ranks": self.mesh.mesh.tolist(),
        }
        # inputs by position: their placeholder names depend on the graph, compared apart
        inputs = {
            str(self.step.input_nodes.index(name)): layout
            for name, layout in self._input_constraints.items()
        }
        constraints = {
            "inputs": inputs,
            "outputs": self._output_constraints,
            "nodes": self._node_constraints,
            "parameter_memory": opts.parameter_memory,
        }
        options = {
            "hardware": self.hardware,
            "time_limit_s": self.time_limit_s,
            "gap_tolerance": self.gap_tolerance,
            "memory_limit_bytes": self.memory_limit_bytes,
            "recompute": self.recompute,
            "optimizer": self.optimizer,
            "strict": self.strict,
            "runtime": self.runtime,
            "compile": self.compile,
            "capture": self.capture,
            "mp_policy": repr(self.mp_policy),
        }
        parts = {"graph": graph, "mesh": mesh, "constraints": constraints, "options": options}
        numel = sum(p.numel() for p in self._source_model.parameters())
        summaries = {
            "graph": f"{len(self.step.gm.graph.nodes)} graph nodes, "
            f"{len(self.step.param_fqns)} parameters of {numel} elements",
            "mesh": f"{mesh['shape']} {mesh['dim_names'] or ''}".strip(),
        }
        if plan is not None:
            parts["plan"] = plan
        check_ranks_agree(parts, summaries, self.mesh, self.rank_timeout_s)
        self._ranks_checked = True

    def _variant_planner(self):
        """How the parallel module plans its eval / no-grad steps (modes.py): with this
        planner's options, the given layouts pinned, and no parameter budget (parameters
        keep the training step's layouts, which met it)."""
        base = self.options()
        cache_setting = self.plan_cache
        mesh = self.mesh

        def plan_variant(step: TracedStep, pins: dict, output_pins: dict) -> dict:
            from autoshard.planning.graph_export import graph_json

            opts = base.replace(
                input_constraints={},
                node_constraints=pins,
                output_constraints=output_pins,
                parameter_memory=None,
            )
            graph = graph_json(step, mesh=mesh)
            return same_plan_on_every_rank(
                lambda: plan_traced_step(step, opts, graph),
                *cache_and_key(cache_setting, graph, opts),
                mesh=mesh,
            )

        return plan_variant


# What AutoParallel's parallel graph keeps of each traced node besides its op: where it came
# from (source line, module stacks, autograd's seq_nr pairing forward and backward nodes) and
# the tags of the model's own torch.utils.checkpoint. Graph passes and debugging read them;
# autoshard's program recomputes what its plan says, not what the tags say.
_TRACED_META_KEYS = (
    "stack_trace",
    "nn_module_stack",
    "fwd_nn_module_stack",
    "seq_nr",
    "recompute",
    "ac_graph_id",
)


def _with_traced_meta(gm: torch.fx.GraphModule, traced: torch.fx.GraphModule):
    """Sets ``_TRACED_META_KEYS`` of each traced node on the lowered nodes computed
    from it (``meta["custom"]["autoshard_node"]`` names it; a collective names the node it
    moves a value for, a bucket of several nodes' values names none and gets none). ``gm`` is a fresh copy (joint_graph), so the
    graphs the module runs are not touched."""
    traced_meta = {n.name: n.meta for n in traced.graph.nodes}
    for node in gm.graph.nodes:
        custom = node.meta.get("custom")
        source = traced_meta.get(custom.get("autoshard_node")) if isinstance(custom, dict) else None
        for key in _TRACED_META_KEYS if source else ():
            # the traced value wins: the lowering's own capture numbers seq_nr afresh,
            # which pairs no backward node with its forward one
            if key in source:
                node.meta[key] = source[key]
    return gm


def _fake_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are FakeTensors: every tensor
    is replaced before copying (a shared tensor by one shared fake), so no data is copied."""
    import copy

    from torch._subclasses import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, Any] = {}
    for _, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        if id(t) in memo:
            continue
        fake = mode.from_tensor(t.detach())
        memo[id(t)] = (
            nn.Parameter(fake, requires_grad=t.requires_grad)
            if isinstance(t, nn.Parameter)
            else fake
        )
    return copy.deepcopy(model, memo)


def _bar_on_this_rank() -> bool | None:
    """Progress bars (on a terminal) from rank 0 only, not one per rank."""
    import torch.distributed as dist

    return None if not dist.is_initialized() or dist.get_rank() == 0 else False


def _input_constraints_from_samples(leaves: list) -> list:
    out = []
    for x in leaves:
        if isinstance(x, DTensor):
            out.append(tuple(x.placements))
        elif isinstance(x, torch.Tensor):
            out.append(None)  # plain tensors: global and replicated
        else:
            raise TypeError(
                f"sample_inputs leaves must be Tensor or DTensor, got " f"{type(x).__name__}"
            )
    return out


def _flatten_out_shardings(out_shardings: Any) -> list:
    if out_shardings is None:
        return []
    if (
        isinstance(out_shardings, tuple)
        and out_shardings
        and all(isinstance(p, Placement) for p in out_shardings)
    ):
        return [out_shardings]
    leaves: list = []

    def walk(v):
        if isinstance(v, tuple) and v and all(isinstance(p, Placement) for p in v):
            leaves.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        else:
            raise TypeError(f"out_shardings must contain tuples of Placements, found {v!r}")

    walk(out_shardings)
    if not leaves:
        raise ValueError("out_shardings must contain at least one placement tuple")
    return leaves


def auto_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    sample_inputs: Any,
    out_shardings: Any = None,
    *,
    mp_policy: Any = None,
    parameter_memory_budget: tuple | None = None,
    hardware: str | None = None,
    strict: bool = False,
    verbose: bool = False,
    time_limit_s: float | None = None,
    compile: bool = False,
    runtime: str = "program",
    rank_timeout_s: float = DEFAULT_TIMEOUT_S,
    preset: str | None = None,
    dynamic: bool = False,
    gap_tolerance: float | None = None,
    plan_cache: Any = True,
    repeated_layers: str | None = None,
    memory_limit_bytes: int | None = None,
    recompute: str | None = None,
    **autoparallel_kwargs,
) -> nn.Module:
    """One call: trace, plan and apply. ``sample_inputs``: a pytree (or a zero-argument
    callable returning one, or ForwardInputs) of Tensor / DTensor leaves; a DTensor's global
    shape is traced and its placements become the input constraint, a plain tensor is the
    global value, replicated. ``parameter_memory_budget=(low, high)``: each may be None for
    the defaults; None adds no memory constraint. ``rank_timeout_s``: see AutoParallel.
    ``preset``: see AutoParallel; it then sets the input layouts and parameter budget, so
    samples are plain tensors and ``parameter_memory_budget`` is left out.
    ``dynamic``, ``gap_tolerance``, ``plan_cache``, ``repeated_layers``,
    ``memory_limit_bytes``, ``recompute``, ``cp_load_balance`` and AutoParallel's
    other keywords
    (``reshard_after_forward``, ``cost_model``, ``repeated_subgraphs``, ``enable_ac``,
    ``ac_stage_size_in_GiB``): see AutoParallel."""

    planning_keywords = {"reshard_after_forward", "cost_model", "repeated_subgraphs"}
    # AutoParallel's activation checkpointing, routed to the planner's recompute mode
    ac_keywords = {"enable_ac", "ac_stage_size_in_GiB"}
    unknown = set(autoparallel_kwargs) - planning_keywords - ac_keywords - {"cp_load_balance"}
    if unknown:
        raise TypeError(f"auto_parallel() got unexpected keyword argument(s) {sorted(unknown)}")
    check_autoparallel_keywords(
        dynamic=dynamic, **{k: v for k, v in autoparallel_kwargs.items() if k in planning_keywords}
    )
    samples = sample_inputs() if callable(sample_inputs) else sample_inputs
    fi = (
        samples
        if isinstance(samples, ForwardInputs)
        else (
            ForwardInputs(args=samples) if isinstance(samples, tuple) else ForwardInputs((samples,))
        )
    )
    leaves, spec = pytree.tree_flatten((tuple(fi.args), dict(fi.kwargs)))
    constraints = _input_constraints_from_samples(leaves)
    check_auto_parallel_args(preset, constraints, parameter_memory_budget)
    replicated = (Replicate(),) * mesh.ndim
    constraints = [c if c is not None else replicated for c in constraints]

    def input_fn():
        def meta_like(x):
            if isinstance(x, torch.Tensor):
                return torch.empty(tuple(x.shape), dtype=x.dtype)
            return x

        a, k = pytree.tree_unflatten([meta_like(x) for x in leaves], spec)
        return ForwardInputs(args=a, kwargs=k)

    with AutoParallel(
        model,
        input_fn,
        mesh,
        mp_policy=mp_policy,
        hardware=hardware,
        strict=strict,
        time_limit_s=time_limit_s,
        compile=compile,
        runtime=runtime,
        rank_timeout_s=rank_timeout_s,
        preset=preset,
        dynamic=dynamic,
        gap_tolerance=gap_tolerance,
        plan_cache=plan_cache,
        repeated_layers=repeated_layers,
        memory_limit_bytes=memory_limit_bytes,
        recompute=recompute,
        **autoparallel_kwargs,
    ) as autop:
        if preset is None:  # a preset has added its own input and parameter constraints
            autop.add_input_constraints(constraints)
            if parameter_memory_budget is not None:
                low, high = parameter_memory_budget
                autop.add_parameter_memory_constraint(low, high)
            else:
                autop.remove_parameter_memory_constraint()
        outs = _flatten_out_shardings(out_shardings)
        if outs:
            autop.add_output_constraints(outs)
        plan = autop.optimize_placement(verbose=verbose)
        return autop.apply_placement(plan)
