"""Test-only emulation of a CUDA host on this CPU-only torch build.

Fake tensors may live on "cuda" devices without a GPU, but whole code paths stop at the
first question torch asks the driver (``torch.cuda.is_available``, ``_lazy_init``,
``get_device_properties``...). ``emulated_cuda`` answers those questions as a host with
``count`` GPUs named ``name`` would, so tracing and planning with fake CUDA tensors run
here as they would on the GPU host. Nothing may run real CUDA kernels under it.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Iterator
from unittest import mock

import torch

H100_NAME = "NVIDIA H100 80GB HBM3"


def _properties(name: str, total_memory: int, major: int, minor: int) -> SimpleNamespace:
    # the fields torch reads while tracing (SDPA kernel choice, inductor's checks) and the
    # ones autoshard reads (name, memory)
    return SimpleNamespace(
        name=name,
        total_memory=total_memory,
        major=major,
        minor=minor,
        multi_processor_count=132,
        is_integrated=False,
        gcnArchName="",
        warp_size=32,
        max_threads_per_multi_processor=2048,
        L2_cache_size=50 << 20,
        uuid="emulated",
    )


@contextlib.contextmanager
def emulated_cuda(
    name: str = H100_NAME,
    count: int = 8,
    current: int = 0,
    total_memory: int = 80 * 10**9,
    capability: tuple[int, int] = (9, 0),
) -> Iterator[dict]:
    """A host with ``count`` GPUs called ``name``, ``current`` selected. Yields the state
    (``{"current": index}``) that ``torch.cuda.set_device`` changes."""
    state = {"current": current}
    props = _properties(name, total_memory, *capability)

    def index_of(device=None) -> int:
        if device is None:
            return state["current"]
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return d.index if d.index is not None else state["current"]

    def set_device(device) -> None:
        state["current"] = index_of(device)

    patches = [
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.is_initialized", return_value=True),
        mock.patch("torch.cuda._lazy_init", return_value=None),
        mock.patch("torch.cuda.device_count", return_value=count),
        mock.patch("torch.cuda.current_device", side_effect=lambda: state["current"]),
        mock.patch("torch.cuda.set_device", side_effect=set_device),
        mock.patch("torch.cuda.get_device_name", side_effect=lambda device=None: name),
        mock.patch("torch.cuda.get_device_properties", side_effect=lambda device=None: props),
        mock.patch("torch.cuda.get_device_capability", side_effect=lambda device=None: capability),
        # tracing saves and restores the generators of every device torch has
        mock.patch(
            "torch.cuda.get_rng_state",
            side_effect=lambda device="cuda": torch.zeros(16, dtype=torch.uint8),
        ),
        mock.patch("torch.cuda.set_rng_state", return_value=None),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield state
