"""This rank's shard of a full (global) tensor, copied to the device alone.

``distribute_tensor(full, mesh, placements, src_data_rank=None)`` first moves the whole
tensor to the mesh's device and slices it there: loading a 70B model's fp32 embedding that
way puts 4.2 GB on every GPU for a moment, whatever its shard is. Here the slicing happens
where ``full`` lives (a view: nothing is copied) and only the shard crosses to the device.
The chunks are DTensor's own (``compute_local_shape_and_global_offset``: torch.chunk
semantics, empty chunks at the end of uneven splits, nested splits of one dim in mesh-dim
order), so the values are the ones ``distribute_tensor`` gives.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from autoshard.program.interpreter import contiguous_stride


def _sliceable(placements: Sequence[Placement]) -> bool:
    """Layouts whose shard is one box of the global tensor (plus Partial's elementwise
    split of a replicated value); _StridedShard and other exotic placements are not."""
    return all(type(p) in (Shard, Replicate, Partial) for p in placements)


def shard_view(
    full: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]
) -> torch.Tensor:
    """This rank's box of ``full`` as a view on ``full``'s own device (no copy)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = tuple(placements)
    if not _sliceable(placements):
        raise ValueError(f"shard_view: no box for the placements {placements}")
    # Shard(-1) and friends: the offsets are computed per tensor dim, so normalise first
    placements = tuple(
        Shard(p.dim + full.dim()) if isinstance(p, Shard) and p.dim < 0 else p for p in placements
    )
    sizes, offsets = compute_local_shape_and_global_offset(tuple(full.shape), mesh, placements)
    out = full
    for d, (size, start) in enumerate(zip(sizes, offsets)):
        if size != full.shape[d]:
            out = out.narrow(d, start, size)
    return out


def local_shard(
    full: torch.Tensor,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    *,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """This rank's local tensor of ``full`` in ``placements``, on ``device`` in ``dtype``
    (default: ``full``'s), contiguous and never aliasing ``full``: equal to
    ``distribute_tensor(full.to(device, dtype), mesh, placements, src_data_rank=None)
    .to_local()``, but only the shard is ever copied to ``device``."""
    full = full.detach()
    dtype = dtype or full.dtype
    placements = tuple(placements)
    if not _sliceable(placements):  # no box to cut out: DTensor's own way, full copy
        return distribute_tensor_locally(full.to(device=device, dtype=dtype), mesh, placements)
    # a conversion to another dtype is elementwise, so converting the shard alone gives the
    # same values as converting the whole tensor first
    view = shard_view(full, mesh, placements)
    shard = view.to(device=device, dtype=dtype)
    if shard is view or not shard.is_contiguous():  # `to` copied nothing: own memory, as
        shard = shard.clone(memory_format=torch.contiguous_format)  # DTensor's shards have
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Partial):  # Replicate -> Partial is elementwise (sum: divided by n)
            shard = p._partition_value(shard, mesh, mesh_dim)
    return shard


def distribute_tensor_locally(
    full: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement]
) -> torch.Tensor:
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, mesh, placements, src_data_rank=None).to_local()


def shard_as_dtensor(
    full: torch.Tensor,
    mesh: DeviceMesh,
    placements: Sequence[Placement],
    *,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> DTensor:
    """``local_shard`` wrapped as a DTensor of ``full``'s global shape and (contiguous)
    strides, as ``distribute_tensor`` returns it."""
    local = local_shard(full, mesh, placements, device=device, dtype=dtype)
    return DTensor.from_local(
        local,
        mesh,
        tuple(placements),
        run_check=False,
        shape=full.shape,
        stride=contiguous_stride(full.shape),
    )
