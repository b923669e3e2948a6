"""Which hardware profile a CUDA mesh is planned for, and how its float32 matmuls run.

The cost model's GPU profiles (cpp/src/cost/hardware_profiles.cpp, docs/cost_model.md) are
the SXM boards of four parts: A100 80GB, H100, H200 and B200. On a host with a GPU the
profile is chosen from ``torch.cuda.get_device_name``: the board's exact name picks its
profile; another board of the same part (PCIe, NVL, 40 GB) gets its part's profile with the
device's own memory size, and a log line says the rates are the SXM board's; a GPU of no
known part is planned as an H100, with a warning. ``hardware=`` on AutoParallel and
auto_parallel overrides all of this.

Float32 matmuls run on TF32 tensor cores only when the user allows it
(``torch.backends.cuda.matmul.fp32_precision = "tf32"``, or the older
``allow_tf32`` / ``set_float32_matmul_precision("high")``); PyTorch's default is full
float32, several times slower. The planner is told which (``fp32_matmul_precision``).
"""

from __future__ import annotations

import logging
import re

import torch

log = logging.getLogger("autoshard")

# the planner's profile for a CUDA mesh planned on a host without a GPU, or for a GPU of no
# known part
FALLBACK_GPU = "H100"

# (part, pattern of torch.cuda.get_device_name): the part's name as a word of its own, so
# that "GH200" (Grace Hopper) is not taken for an H200, nor "GB200" for a B200
_PARTS = tuple(
    (part, re.compile(rf"(?<![A-Za-z0-9]){part}(?![0-9])", re.IGNORECASE))
    for part in ("B200", "H200", "H100", "A100")
)


def gpu_part(device_name: str) -> str | None:
    """The profile's part ("A100", "H100", "H200", "B200") of a device name, or None."""
    for part, pattern in _PARTS:
        if pattern.search(device_name):
            return part
    return None


def detect_gpu_hardware(device: int | None = None) -> str | dict:
    """The hardware profile of this host's GPU ``device`` (default: the current one): a
    built-in profile's name, or a profile object ``{"base": PART, ...}`` for another board
    of a known part. Logs what was found and chosen."""
    from autoshard import _core

    name = torch.cuda.get_device_name(device)
    try:
        exact = _core.hardware_profile(name)["name"]
    except ValueError:  # not a built-in profile's board
        exact = None
    if exact is not None:
        log.info(
            "autoshard: GPU %r: planning with the %s hardware profile (pass hardware=... "
            "to plan for other hardware)",
            name,
            exact,
        )
        return exact
    part = gpu_part(name)
    if part is None:
        log.warning(
            "autoshard: GPU %r is none of the known parts (%s): planning with the %s "
            "profile; pass hardware={'base': 'H100', ...} with this GPU's figures (FLOP/s, "
            "HBM and link bandwidths: docs/cost_model.md) for plans sized for it",
            name,
            ", ".join(p for p, _ in _PARTS),
            FALLBACK_GPU,
        )
        return FALLBACK_GPU
    memory = int(torch.cuda.get_device_properties(device).total_memory)
    log.warning(
        "autoshard: GPU %r: planning with the %s (SXM) profile and this device's %.0f GB; "
        "its compute and link rates are the SXM board's, which this board may not reach: "
        "pass hardware={'base': '%s', ...} with its own figures (docs/cost_model.md) to "
        "correct them",
        name,
        part,
        memory / 1e9,
        part,
    )
    return {"base": part, "name": f"{part} ({name})", "memory_bytes": memory}


def hardware_without_gpu(mesh_device_type: str) -> str:
    """The profile of a mesh planned on a host without its GPUs (a virtual cluster on a
    fake process group), with the log line saying so."""
    log.info(
        "autoshard: planning a %s mesh on a host without a GPU: %s hardware profile "
        "(pass hardware=... for other GPUs)",
        mesh_device_type,
        FALLBACK_GPU,
    )
    return FALLBACK_GPU


def fp32_matmul_precision() -> str:
    """How this process runs float32 matmuls on CUDA: "tf32" (TF32 tensor cores) or "ieee"
    (full float32, PyTorch's default)."""
    matmul = torch.backends.cuda.matmul
    try:
        # the new setting; it also reflects allow_tf32 / set_float32_matmul_precision
        precision = matmul.fp32_precision
    except AttributeError:  # a torch before the fp32_precision settings
        return "tf32" if matmul.allow_tf32 else "ieee"
    return "tf32" if precision == "tf32" else "ieee"


def planner_fp32_precision(hardware) -> str | None:
    """The ``fp32_matmul_precision`` planner option for ``hardware``: this process's
    setting, unless the profile object names ``fp32_matmul_uses_tf32`` itself (the user's
    explicit word wins)."""
    if isinstance(hardware, dict) and "fp32_matmul_uses_tf32" in hardware:
        return None
    return fp32_matmul_precision()


MEASURE_ON_CUDA = (
    "hardware='measure' measures CPU ranks on a real process group (gloo); on a CUDA mesh "
    "autoshard reads the GPU's name instead (leave hardware out: {detected}), or pass a "
    "profile name ({known}) or a profile object such as {{'base': 'H100', "
    "'peak_flops_bf16': ..., 'hbm_bandwidth': ...}} with figures measured by "
    "bench/calibrate_compute.py"
)


def measure_refusal(mesh_device_type: str) -> str:
    """Why hardware='measure' is refused on a mesh that is not CPU ranks on a real group,
    and what to pass instead."""
    from autoshard import _core

    known = ", ".join(_core.known_hardware())
    if mesh_device_type == "cuda":
        detected = (
            f"this host's GPU is {torch.cuda.get_device_name()!r}"
            if torch.cuda.is_available()
            else f"without a GPU it plans for {FALLBACK_GPU}"
        )
        return MEASURE_ON_CUDA.format(detected=detected, known=known)
    return (
        "hardware='measure' measures CPU ranks on a real process group (gloo); name a "
        f"profile ({known}) or pass an object of profile fields for other meshes"
    )
