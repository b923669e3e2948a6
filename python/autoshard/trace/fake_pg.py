"""A virtual cluster in one process, for planning meshes larger than the machine.

``fake_mesh((8, 8), ("dp", "tp"))`` initialises torch's "fake" process-group backend (every
collective is a no-op) with world size 64 and returns a DeviceMesh on it, so a 64-GPU plan
can be traced and solved on a laptop with no GPU. Nothing may be *run* on such a mesh.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def on_real_process_group() -> bool:
    """A process group is initialised and its collectives run (it is not the fake one)."""
    return dist.is_available() and dist.is_initialized() and dist.get_backend() != "fake"


def real_multi_rank_group() -> bool:
    """Collectives really cross ranks: what rank checks and rank-0 broadcasts need."""
    return on_real_process_group() and dist.get_world_size() > 1


def init_fake_process_group(world_size: int, rank: int = 0) -> None:
    """Initialise the default process group with the fake backend (no-op collectives)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialised; call "
            "torch.distributed.destroy_process_group() first (or use "
            "fake_mesh as a context manager)"
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad fake world: world_size={world_size}, rank={rank}")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def fake_mesh(
    shape: Sequence[int], dim_names: Sequence[str] | None = None, device_type: str = "cuda"
) -> DeviceMesh:
    """A DeviceMesh of ``shape`` on a fresh fake process group of prod(shape) ranks.
    ``device_type="cuda"`` works without a GPU: tracing uses fake CUDA tensors."""
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"mesh shape must be positive sizes, got {shape}")
    init_fake_process_group(math.prod(shape))
    names = tuple(dim_names) if dim_names is not None else None
    if names is not None and len(names) != len(shape):
        raise ValueError(f"{len(names)} dim names for a {len(shape)}-d mesh")
    if device_type == "cuda":
        return _cuda_mesh_without_gpu(shape, names)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def _cuda_mesh_without_gpu(shape, names) -> DeviceMesh:
    import torch

    if torch.cuda.is_available():
        return init_device_mesh("cuda", shape, mesh_dim_names=names)
    # init_device_mesh would select a CUDA device; the DeviceMesh constructor only records
    # the device type, which is all tracing and planning read.
    ranks = torch.arange(math.prod(shape)).view(shape)
    return (
        DeviceMesh("cuda", ranks, mesh_dim_names=names, _init_backend=False)
        if _accepts_init_backend()
        else DeviceMesh("cuda", ranks, mesh_dim_names=names)
    )


def _accepts_init_backend() -> bool:
    import inspect

    return "_init_backend" in inspect.signature(DeviceMesh.__init__).parameters


@contextlib.contextmanager
def fake_world(
    shape: Sequence[int], dim_names: Sequence[str] | None = None, device_type: str = "cuda"
) -> Iterator[DeviceMesh]:
    """``with fake_world((8, 8), ("dp", "tp")) as mesh:`` - the process group is destroyed
    on exit."""
    mesh = fake_mesh(shape, dim_names, device_type)
    try:
        yield mesh
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
