"""Single-device ``init_weights`` code on the parallel module's DTensor parameters.

A model's own ``init_weights`` was written for full tensors. On the parallel module its
parameters and buffers are DTensors holding this rank's shard, so three common idioms would
fail or silently do the wrong thing:

- ``self.w = nn.Parameter(torch.randn(...))`` / ``self.freqs = compute()`` would replace the
  sharded parameter by a plain one (the planned step then finds no DTensor: "'Parameter'
  object has no attribute 'full_tensor'");
- ``self.w.copy_(full)`` / ``self.w.data[:] = full`` mix a DTensor and a plain tensor
  ("aten.copy_.default got mixed torch.Tensor and DTensor");
- ``self.w.data = full`` would swap the storage for a full, unsharded tensor.

While the wrapped ``init_weights`` runs, each of these takes the plain tensor as the FULL
(global) value and copies this rank's part of it into the existing DTensor, with no
communication (every rank computes the same full value, as single-device code does).
In-place initialisers (``nn.init.normal_(w)``) work on DTensors as they are.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.runtime.local_shard import shard_as_dtensor


def _shard_of(full: torch.Tensor, like: DTensor) -> DTensor:
    """``full`` (global value, broadcastable to ``like``) as a DTensor in ``like``'s layout:
    each rank slices its own part where ``full`` lives (a broadcast is a view there), and
    only that part is copied to the device in ``like``'s dtype."""
    full = full.detach()
    if tuple(full.shape) != tuple(like.shape):
        full = full.expand(like.shape)
    return shard_as_dtensor(
        full,
        like.device_mesh,
        like.placements,
        device=like._local_tensor.device,
        dtype=like.dtype,
    )


def _copy_full(dst: DTensor, value: torch.Tensor, what: str) -> None:
    if isinstance(value, DTensor):
        with torch.no_grad():
            dst.copy_(value)
        return
    try:
        torch.broadcast_shapes(tuple(value.shape), tuple(dst.shape))
    except RuntimeError:
        raise ValueError(
            f"init_weights: {what} has shape {tuple(dst.shape)}, the assigned "
            f"tensor {tuple(value.shape)}"
        ) from None
    with torch.no_grad():
        dst.copy_(_shard_of(value, dst))


class _FullCopies(TorchDispatchMode):
    """``copy_`` from a plain tensor into a DTensor: the plain tensor is the full value."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func is torch.ops.aten.copy_.default
            and isinstance(args[0], DTensor)
            and isinstance(args[1], torch.Tensor)
            and not isinstance(args[1], DTensor)
        ):
            return func(args[0], _shard_of(args[1], args[0]), *args[2:], **kwargs)
        return func(*args, **kwargs)


def _assign_into_dtensors(original: Callable) -> Callable:
    def setattr_(module: nn.Module, name: str, value: Any) -> None:
        own = module.__dict__.get("_parameters", {}).get(name)
        if own is None:
            own = module.__dict__.get("_buffers", {}).get(name)
        if (
            isinstance(own, DTensor)
            and isinstance(value, torch.Tensor)
            and not (
                isinstance(value, DTensor)
                and value.placements == own.placements
                and isinstance(value, nn.Parameter) == isinstance(own, nn.Parameter)
            )
        ):
            _copy_full(own, value, f"{type(module).__name__}.{name}")
            return
        original(module, name, value)

    return setattr_


@contextlib.contextmanager
def full_tensor_init():
    """The context init_weights runs in (see the module docstring)."""
    original_setattr = nn.Module.__setattr__
    data = torch._C.TensorBase.data

    def set_data(t, value):
        if (
            isinstance(t, DTensor)
            and isinstance(value, torch.Tensor)
            and not isinstance(value, DTensor)
        ):
            _copy_full(t, value, "tensor.data")
        else:
            data.__set__(t, value)

    nn.Module.__setattr__ = _assign_into_dtensors(original_setattr)
    DTensor.data = property(data.__get__, set_data)
    try:
        with _FullCopies():
            yield
    finally:
        nn.Module.__setattr__ = original_setattr
        del DTensor.data


def wrap_init_weights(init_weights: Callable) -> Callable:
    @functools.wraps(init_weights)
    def wrapped(self, *args, **kwargs):
        with full_tensor_init():
            return init_weights(self, *args, **kwargs)

    return wrapped
