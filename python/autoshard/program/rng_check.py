"""Random ops in a lowered program must draw the same numbers where ranks hold the same data.

The lowered program runs each random op (dropout, rand, bernoulli, ...) on the local shard
with this rank's own generator. Where the op's output is sharded over a mesh dim, ranks along
that dim hold different data, and drawing different numbers is right (as DDP does with
per-rank seeds). Where it is replicated (or partial) over a mesh dim, the ranks along that
dim compute the SAME tensor, so their generators must be in the same state: otherwise the
"replicated" values differ between ranks and every result built on them is silently wrong
(gradients included). So before the first step the ranks along each such dim compare their
generator states, and differing states stop the step with an error saying what to do.

On CUDA, DTensor's offset-based RNG tracker does not leave the random op in the traced
program as itself: it wraps it in the higher-order op ``run_dtensor_rng_op(start, end, op,
*args)``, which moves the CUDA generator's offset so that each shard draws its slice of one
global random tensor. That node carries no op tags, so it is recognised by its target. The
states compared are those of the generator the program's random ops draw from: the CUDA
generator of the rank's device on GPU runs (the CPU generator there only feeds host-side
work such as data sampling, which may differ by rank), the CPU generator on CPU runs.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.distributed.tensor import Shard

from autoshard.trace.fake_pg import on_real_process_group
from autoshard.program.graph_nodes import OUTSIDE


def random_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes that draw from a generator: ops torch tags nondeterministic_seeded, and
    DTensor's CUDA wrapper around such an op (run_dtensor_rng_op)."""
    return [n for n in gm.graph.nodes if draws_random_numbers(n)]


def draws_random_numbers(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if _is_dtensor_rng_op(node.target):
        return True
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _is_dtensor_rng_op(target) -> bool:
    """``target`` is DTensor's ``run_dtensor_rng_op`` (torch._prims.rng_prims), matched by
    its name: torch builds without it (older ones) must still import this module."""
    return (
        isinstance(target, torch._ops.HigherOrderOperator) and target.name() == "run_dtensor_rng_op"
    )


def replicated_random_dims(program, runner) -> dict[int, list[str]]:
    """Mesh dim -> joint-graph nodes of the random ops whose output is not sharded over it."""
    dims: dict[int, list[str]] = {}
    for n in random_nodes(program.fwd_gm):
        joint = (n.meta.get("custom") or {}).get("autoshard_node")
        layout = runner.planned_output(joint) if joint and joint != OUTSIDE else None
        for d in range(runner.mesh.ndim):
            if layout is None or not isinstance(layout[d], Shard):
                dims.setdefault(d, []).append(joint or n.name)
    return dims


def generator_state(device: torch.device) -> torch.Tensor:
    """The state (a CPU byte tensor) of the default generator that random ops on ``device``
    draw from: the CPU generator for CPU tensors, the device's own one otherwise (CUDA:
    ``torch.cuda.get_rng_state(device)``, which DTensor's RNG tracker also moves)."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.get_rng_state()
    module = getattr(torch, device.type, None)  # torch.cuda, torch.xpu, torch.mps, ...
    get_state = getattr(module, "get_rng_state", None)
    if get_state is None:
        raise RuntimeError(
            f"autoshard: cannot read the random generator state of device type "
            f"{device.type!r} (torch.{device.type}.get_rng_state is missing), so the ranks' "
            "generators cannot be compared before the first step; run the model on cpu or "
            "cuda, or report the device type"
        )
    return get_state(device)


def _state_digest(device: torch.device) -> int:
    state = generator_state(device)
    return int.from_bytes(hashlib.sha256(state.cpu().numpy().tobytes()).digest()[:7], "little")


def check_random_states_once(program, state, runner) -> None:
    """At a program's first eager run (a collective per affected mesh dim, then never);
    ``state``: the program's ProgramRunState (execution.py)."""
    if state.random_states_checked or torch.compiler.is_compiling():
        return
    check_random_states_agree(program, runner)
    state.random_states_checked = True


def check_random_states_agree(program, runner) -> None:
    """Raise when ranks that compute the same random values have different generator
    states (no-op without such ops, on one rank, or on a fake process group)."""
    if not on_real_process_group():
        return
    mesh = runner.mesh
    for d, nodes in sorted(replicated_random_dims(program, runner).items()):
        group = mesh.get_group(d)
        size = dist.get_world_size(group)
        if size == 1:
            continue
        mine = torch.tensor([_state_digest(runner.device)], dtype=torch.int64, device=runner.device)
        every = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(every, mine, group=group)
        digests = [int(t.item()) for t in every]
        if len(set(digests)) > 1:
            ranks = dist.get_process_group_ranks(group)
            name = (mesh.mesh_dim_names or [None] * mesh.ndim)[d]
            dim = f"mesh dim {d}" + (f" ({name!r})" if name else "")
            raise RuntimeError(
                f"autoshard: the random ops {', '.join(nodes[:4])} give values replicated over "
                f"{dim}, but ranks {ranks} of it have different random generator states, so "
                "they would compute different 'replicated' values (and wrong gradients). "
                "Seed every rank alike (torch.manual_seed(seed) with the same seed on every "
                "rank) before the first step; draw per-rank randomness (data sampling) from "
                "a torch.Generator of its own"
            )
