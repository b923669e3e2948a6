"""Per-node questions about a per-rank program graph: is a node communication, and how long
does it run on the hardware the planner prices (``make_custom_runtime_estimation``)."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.flop_counter import flop_registry

from autoshard import _core
from autoshard.planning.planner import default_hardware

# Functional collectives (torch.distributed._functional_collectives) by the collective the
# cost model prices them as, and where the full buffer (the bytes the model is priced on)
# is: the output for a gather, the input otherwise.
_COLLECTIVE_KIND = {
    "all_gather_into_tensor": ("all_gather", "output"),
    "all_gather_into_tensor_coalesced": ("all_gather", "output"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "input"),
    "all_reduce": ("all_reduce", "input"),
    "all_reduce_coalesced": ("all_reduce", "input"),
    "all_to_all_single": ("all_to_all", "input"),
    "broadcast": ("all_gather", "input"),
}
_COMM_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")


def _op_namespace_and_name(node: torch.fx.Node) -> tuple[str, str]:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return "", ""
    return target.namespace, target._schema.name.split("::")[-1]


def _is_communication_node(node: torch.fx.Node) -> bool:
    """True for a collective (functional or in-place c10d) or the wait on one."""
    namespace, _ = _op_namespace_and_name(node)
    return namespace in _COMM_NAMESPACES


def is_wait(node: torch.fx.Node) -> bool:
    return _op_namespace_and_name(node)[1] == "wait_tensor"


def is_async_collective(node: torch.fx.Node) -> bool:
    """A functional collective: it returns at once and a ``wait_tensor`` syncs on it."""
    namespace, name = _op_namespace_and_name(node)
    return namespace != "c10d" and _is_communication_node(node) and name != "wait_tensor"


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _arg_values(node: torch.fx.Node):
    return torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))


def _is_alias(node: torch.fx.Node) -> bool:
    """Views (t, view, permute, ...) launch no kernel: their output aliases an input."""
    schema = node.target._schema
    return bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)


def _group_mesh_dim(mesh: DeviceMesh, group_name: str) -> tuple[list[int], int]:
    """The mesh shape and dim a collective's group runs over; a group outside the mesh is
    priced as a flat group of its size."""
    for dim in range(mesh.ndim):
        if mesh.get_group(dim).group_name == group_name:
            return list(mesh.shape), dim
    group = dist.distributed_c10d._resolve_process_group(group_name)
    return [group.size()], 0


def _group_name(node: torch.fx.Node) -> str:
    """The ``group_name`` argument every functional collective takes."""
    for arg, value in zip(node.target._schema.arguments, node.args):
        if arg.name == "group_name":
            return str(value)
    return str(node.kwargs["group_name"])


def make_custom_runtime_estimation(
    mesh: DeviceMesh, hardware: str | dict | None = None
) -> Callable[[torch.fx.Node], float]:
    """An estimator of one node's run time in microseconds, from autoshard's cost model:
    compute nodes by their FLOPs and bytes on the hardware profile's roofline (the profile
    the planner would use for this mesh unless ``hardware`` names one), collectives by the
    collective model over the mesh dim of their process group, views and waits 0."""
    profile = default_hardware(mesh) if hardware is None else hardware
    profile = profile if isinstance(profile, str) else json.dumps(profile)

    def collective_us(node: torch.fx.Node, name: str) -> float:
        kind, side = _COLLECTIVE_KIND[name]
        values = _tensors(node.meta.get("val")) if side == "output" else None
        if values is None:
            values = _tensors(_arg_values(node)[0][0])
        shape, dim = _group_mesh_dim(mesh, _group_name(node))
        return _core.collective_time_us(kind, float(_bytes(values)), profile, shape, dim)

    def compute_us(node: torch.fx.Node) -> float:
        outputs = _tensors(node.meta.get("val"))
        args, kwargs = _arg_values(node)
        moved = float(_bytes(_tensors(list(args) + list(kwargs.values())) + outputs))
        formula = flop_registry.get(node.target.overloadpacket)
        flops = float(formula(*args, **kwargs, out_val=node.meta.get("val"))) if formula else 0.0
        if flops == 0 or not outputs or not outputs[0].is_floating_point():
            return _core.memory_time_us(profile, moved)
        dtype = str(outputs[0].dtype).removeprefix("torch.")
        return _core.compute_time_us(profile, flops, moved, dtype)

    def estimate(node: torch.fx.Node) -> float:
        namespace, name = _op_namespace_and_name(node)
        if not namespace or name == "wait_tensor" or _is_alias(node):
            return 0.0
        if _is_communication_node(node):
            return collective_us(node, name) if name in _COLLECTIVE_KIND else 0.0
        return compute_us(node)

    return estimate
