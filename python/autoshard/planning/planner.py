"""Running the C++ planner on a traced step: which hardware profile it costs the step for,
the plan cache, and one plan for every rank of a real process group. What the API
(api/autoparallel.py) and the sharding optimizer call to get a plan."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from autoshard.planning.options import PlannerOptions
from autoshard.trace.traced_step import TracedStep

log = logging.getLogger("autoshard")


MEASURE = "measure"  # hardware: a profile measured on the process group (calibrate.py)


def default_hardware(mesh: DeviceMesh) -> str | dict:
    """The cost model's profile when the user names none: a mesh of CPU ranks on a real
    process group (gloo) runs on CPU cores, so its plans are costed as such ("CPU": one core
    per rank; with more ranks on this host than cores, each rank's compute figures scaled by
    cores / ranks, as that is the share of a core each gets; pass hardware="measure" for
    figures measured on the group: closer to the machine, but they move with its load, and
    so may the plan); a CUDA mesh on a host with a GPU is costed as that GPU (its name:
    hardware.detect_gpu_hardware); a CUDA mesh without one, or a CPU mesh on a fake process
    group (planning a virtual GPU cluster on this machine), is costed as H100s."""
    import torch.distributed as dist

    from autoshard.planning.hardware import detect_gpu_hardware, hardware_without_gpu

    backend = dist.get_backend() if dist.is_initialized() else ""
    if mesh.device_type == "cpu" and backend != "fake":
        log.info(
            "autoshard: CPU mesh on a %s process group: planning with the 'CPU' "
            "hardware profile (pass hardware=... to plan for other hardware, or "
            "hardware='measure' to measure this group)",
            backend or "no",
        )
        return cpu_profile_for_host()
    if mesh.device_type == "cuda" and torch.cuda.is_available():
        return detect_gpu_hardware()
    return hardware_without_gpu(mesh.device_type)


def cpu_profile_for_host() -> str | dict:
    """ "CPU", or when this host runs more ranks (LOCAL_WORLD_SIZE, as torchrun sets it) than
    the cores this process may use, the CPU profile with its compute figures (FLOP/s and
    memory bandwidth) scaled by cores / ranks. Every rank of a host computes the same."""
    import os

    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not cores or ranks <= cores:
        return "CPU"
    from autoshard import _core

    base, share = _core.hardware_profile("CPU"), cores / ranks
    scaled = {
        k: base[k] * share
        for k in (
            "peak_flops_fp32",
            "peak_flops_fp32_cuda_core",
            "peak_flops_bf16",
            "peak_flops_fp64",
            "hbm_bandwidth",
        )
    }
    return {"base": "CPU", "name": f"CPU ({ranks} ranks on {cores} cores)", **scaled}


def measured_hardware(hardware: Any, mesh: DeviceMesh) -> Any:
    """``hardware`` with "measure" replaced by the profile measured now on every rank (all
    ranks must be here: called after the rank check)."""
    if hardware != MEASURE:
        return hardware
    import torch.distributed as dist

    from autoshard.planning.calibrate import measure_cpu_profile
    from autoshard.trace.fake_pg import on_real_process_group

    if mesh.device_type != "cpu" or not on_real_process_group():
        from autoshard.planning.hardware import measure_refusal

        raise ValueError(measure_refusal(mesh.device_type))
    profile = measure_cpu_profile()
    log.info(
        "autoshard: measured on %d ranks: %.1f GFLOP/s matmul, %.0f us per collective, "
        "%.2f GB/s",
        dist.get_world_size(),
        profile["peak_flops_fp32"] / 1e9,
        profile["collective_launch_us"],
        profile["intra_node_bandwidth"] / 1e9,
    )
    return profile


def mesh_trace_device(mesh: DeviceMesh) -> torch.device:
    # CUDA meshes trace with fake CUDA tensors when this torch has CUDA; a CPU-only build
    # aborts on CUDA device guards even for fake tensors, so it traces on CPU (same shapes,
    # the CPU variants of fused kernels such as flash attention). The model's fake weights
    # and the example inputs, whatever device they were made on, are put on this device
    # (trace._fake_inputs); each rank's program then runs on its own (runtime._fix_device).
    if mesh.device_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def cache_and_key(setting: Any, graph: str, options: PlannerOptions) -> tuple:
    """The plan cache of ``setting`` (plan_cache.py) and the key of planning ``graph`` with
    ``options``; (None, None) when caching is off."""
    from autoshard.planning.plan_cache import PlanCache, plan_key

    cache = PlanCache.resolve(setting)
    return (cache, plan_key(graph, options.to_json())) if cache is not None else (None, None)


def same_plan_on_every_rank(
    make_plan, cache=None, key: str | None = None, mesh: DeviceMesh | None = None
) -> dict:
    """The solver is anytime: under a wall-clock limit two ranks could stop at different
    plans. With a real multi-rank process group, rank 0 plans and broadcasts its plan (or
    its error) so every rank runs the same one. With a plan cache (plan_cache.py) a stored
    plan is used instead of planning: when every rank finds the same one under the same key
    (compared by digest), each loads its own and nothing is broadcast; otherwise rank 0's
    (cached or new, then stored) is broadcast. On a 1-D ``mesh`` of part of the ranks (a
    pipeline stage's data-parallel ranks, which plan their own stage while other ranks plan
    theirs), all of this happens among the mesh's ranks, its first rank planning."""
    import torch.distributed as dist

    from autoshard.trace.fake_pg import real_multi_rank_group
    from autoshard.planning.plan_cache import cached_plan, plan_digest

    if not real_multi_rank_group():
        return cached_plan(cache, key, make_plan)
    group = planning_group(mesh)
    if group is not None and group.size() == 1:
        return cached_plan(cache, key, make_plan)
    # every rank takes part whether or not it caches, so the collectives always match
    mine = cache.load(key) if cache is not None else None
    found: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(
        found, (key, plan_digest(mine) if mine is not None else None), group=group
    )
    if mine is not None and all(f == found[0] for f in found):
        log.info("autoshard: plan cache hit (key %s, %s) on every rank", key[:16], cache.path(key))
        mine["plan_cache"] = {"key": key, "hit": True}
        return mine
    box: list = [None]
    if dist.get_rank(group) == 0:
        try:
            box[0] = ("plan", cached_plan(cache, key, make_plan))
        except Exception as e:  # every rank must raise the same error, not hang
            box[0] = ("error", (type(e), str(e)))
    dist.broadcast_object_list(box, group=group, group_src=0)
    kind, value = box[0]
    if kind == "error":
        exc_type, msg = value
        try:
            error = exc_type(msg)
        except Exception:  # an exception class that does not take one message
            error = RuntimeError(msg)
        raise error
    return value


def planning_group(mesh: DeviceMesh | None):
    """The process group whose ranks plan together: the default group (None), except for a
    1-D mesh of only some of the ranks: that mesh's group. (A sub-mesh of more dims has no
    group of all its ranks without every rank creating one: its ranks keep planning with
    every rank, which must then plan in step.)"""
    import torch.distributed as dist

    if mesh is None or mesh.ndim != 1 or not dist.is_initialized():
        return None
    # a mesh as large as the world (or a virtual one, larger, with no process groups) plans
    # with every rank
    if mesh.size() >= dist.get_world_size() or mesh.get_coordinate() is None:
        return None
    return mesh.get_group()


def plan_traced_step(
    step: TracedStep | None, options: PlannerOptions, graph: str | None = None
) -> dict:
    """Graph JSON + options -> the C++ planner -> plan dict. Planner errors (unsupported op
    with its source line, infeasible constraints such as a parameter budget no plan meets)
    surface as ValueError carrying the planner's message."""
    from autoshard import _core
    from autoshard.planning.graph_export import graph_json
    from autoshard.planning.options import plan_graph

    if not hasattr(_core, "plan_graph"):
        raise NotImplementedError(
            "autoshard: this build of autoshard._core has no planner "
            "(plan_graph); rebuild with `pip install -e .`"
        )
    graph = graph if graph is not None else graph_json(step)
    try:
        return plan_graph(graph, options)
    except (ValueError, RuntimeError) as e:
        # the planner's message names the input and the fix; the binding's traceback adds
        # nothing, so the error starts here
        msg = str(e)
        raise ValueError(
            msg if msg.startswith("autoshard") else f"autoshard planner: {msg}"
        ) from None


def log_plan(plan_json: dict, step: TracedStep | None = None) -> None:
    """The verbose plan log (logger "autoshard"): per node its strategy count, chosen
    placement, compute and communication cost; then the totals."""
    from autoshard.planning.plan import Plan

    plan = Plan.from_json(plan_json)
    for name, e in plan.nodes.items():
        layout = " ".join("(" + ",".join(o) + ")" if o is not None else "-" for o in e.outputs)
        log.info(
            "%-28s strategies=%-4s out=%-22s in=%-40s compute=%.2fus comm=%.2fus",
            name,
            "-" if e.strategies is None else e.strategies,
            layout,
            " ".join("(" + ",".join(i) + ")" if i else "-" for i in e.inputs) or "-",
            e.compute_us,
            e.comm_us,
        )
    s = plan.summary
    log.info(
        "total %.1f us per step: compute %.1f us, exposed communication %.1f us (%.0f%%; "
        "%.1f us in all, the rest behind compute); parameters %.1f MiB per GPU; lower "
        "bound %.1f us",
        s.total_us,
        s.compute_us,
        s.exposed_comm_us,
        100.0 * s.exposed_comm_us / s.total_us if s.total_us else 0.0,
        s.comm_us,
        s.parameter_bytes_per_gpu / 2**20,
        s.lower_bound_us,
    )
    for line in plan.report.splitlines():
        log.info("%s", line)
