"""Helpers for running a lowered program for several ranks at once under torch's
LocalTensorMode (tests of compile_on_one_rank programs)."""

import torch
from torch.distributed._local_tensor import LocalTensor


def per_rank(t: torch.Tensor, world: int) -> LocalTensor:
    """``t`` as a LocalTensor with one copy per rank: a replicated value comes out of
    ``distribute_tensor(...).to_local()`` as one plain tensor, which an in-place write or a
    rank-dependent op would treat as shared."""
    if isinstance(t, LocalTensor):
        return t
    return LocalTensor({r: t.clone() for r in range(world)})
