"""One-word presets: named bundles of planner constraints on a named mesh.

A preset fixes two things and leaves every other layout to the planner:
  - the layout of the model's inputs (the batch dim split over the data-parallel mesh dims,
    whole on a "tp" dim, where every rank of a tensor-parallel group sees the same tokens);
  - the parameter memory per GPU (``low``, ``high`` as fractions of all parameter bytes).

    preset    mesh (dim names)              inputs            parameter memory per GPU
    ddp       any, no "tp" dim              S(0) on every dim low = high = 1
    fsdp      any, no "tp" dim              S(0) on every dim high = 1/mesh size
    hsdp      2-D (replicate, shard)        S(0) on both      each parameter (R, S(0))
    tp        a "tp" dim (+ replica dims)   R on tp, else S(0) 1/tp size (+2%)
    fsdp+tp   a "tp" dim + data dims        R on tp, else S(0) high = 1/mesh size

A mesh dim named "cp" (context parallelism) may join any preset: inputs of 2 or more dims
have their sequence (dim 1) split over it, ``S(1)``, and 1-D inputs are whole on it; the
parameters are counted as over a data dim (fsdp: 1/mesh size, cp included, as FSDP over
dp x cp), except hsdp, whose pinned layout keeps them whole on cp, and tp, whose band is 1/tp.
AutoParallel then traces the sequence in load-balanced head-tail order (cp_load_balance,
trace/load_balance.py).

"1/k (+2%)" is low = 1/k, high = 1.02/k: sharded over that dim and no other. The slack lets
small vectors (norm weights) stay whole, as tensor parallelism keeps them; a band of width
zero (low = high = 1/k) leaves the solver almost no feasible plans to move between, and its
search then ends far from the optimum. hsdp pins each parameter to FSDP2's HSDP layout
(whole over replicate, dim 0 split over shard) instead of a band: with the batch split over
both dims, the solver's search under a 1/shard band ended 20x above its lower bound on the
1-layer demo model, while pinned parameters leave it an easy problem (compute layouts stay
free).

docs/presets.md shows each preset's plan on the demo model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autoshard.planning.options import PlannerOptions

PRESET_NAMES = ("ddp", "fsdp", "hsdp", "tp", "fsdp+tp")
TP_DIM = "tp"
CP_DIM = "cp"  # the context-parallel dim: splits the sequence (dim 1) of the inputs
BAND_SLACK = 1.02  # high = BAND_SLACK * low for the hsdp and tp bands


class PresetError(ValueError):
    """An unknown preset, or one that does not fit the mesh it is given."""


@dataclass(frozen=True)
class PresetConstraints:
    """What a preset pins, in the planner's own terms (docs/formats.md section 2)."""

    name: str
    batch_layout: tuple[str, ...]  # one placement string per mesh dim, for batch inputs
    # (low, high) fractions of all parameter bytes, or None: no budget
    parameter_memory: tuple[float, float] | None
    # every parameter's at-rest layout (with "S(0)" read as "R" for 0-d ones), or None
    parameter_layout: tuple[str, ...] | None = None
    cp_dim: int | None = None  # the mesh dim splitting the inputs' sequence (dim 1), or None

    @property
    def sequence_layout(self) -> tuple[str, ...]:
        """The layout of inputs with a sequence dim (2 or more dims): the batch layout with
        the sequence split over the cp dim."""
        if self.cp_dim is None:
            return self.batch_layout
        return tuple("S(1)" if d == self.cp_dim else p for d, p in enumerate(self.batch_layout))


def resolve(
    name: str | None, shape: Sequence[int], dim_names: Sequence[str] | None
) -> PresetConstraints | None:
    """The constraints of preset ``name`` on a mesh of ``shape`` with ``dim_names`` (None
    for no preset). Raises PresetError naming what does not fit and what would."""
    if name is None:
        return None
    if not isinstance(name, str) or name.strip().lower() not in PRESET_NAMES:
        raise PresetError(
            f"unknown preset {name!r}; choose one of "
            f"{', '.join(PRESET_NAMES)} (docs/presets.md)"
        )
    name = name.strip().lower()
    shape = tuple(int(s) for s in shape)
    names = tuple(dim_names) if dim_names else ()
    size = 1
    for s in shape:
        size *= s
    mesh_desc = f"mesh {list(shape)}" + (
        f" with dims {list(names)}" if names else " without dim names"
    )
    tp = [i for i, n in enumerate(names) if n == TP_DIM]
    cp = [i for i, n in enumerate(names) if n == CP_DIM]
    for dim, found in ((TP_DIM, tp), (CP_DIM, cp)):
        if len(found) > 1:
            raise PresetError(f"preset {name!r}: {mesh_desc} names more than one dim {dim!r}")
    preset = _resolve_data_dims(name, shape, names, size, tp, cp, mesh_desc)
    return PresetConstraints(
        preset.name,
        tuple("R" if i in cp else p for i, p in enumerate(preset.batch_layout)),
        preset.parameter_memory,
        preset.parameter_layout,
        cp[0] if cp else None,
    )


def _resolve_data_dims(name, shape, names, size, tp, cp, mesh_desc) -> PresetConstraints:
    """The preset with the cp dim (if any) counted as a data dim; resolve() then keeps the
    batch whole on cp and splits the sequence over it."""

    if name in ("ddp", "fsdp", "hsdp"):
        if tp:
            raise PresetError(
                f"preset {name!r} splits the batch over every mesh dim, but {mesh_desc} has a "
                f"{TP_DIM!r} dim; use preset 'tp' or 'fsdp+tp' there, or rename the dims"
            )
        batch = ("S(0)",) * len(shape)
        if name == "ddp":
            return PresetConstraints(name, batch, (1.0, 1.0))
        if name == "fsdp":
            return PresetConstraints(name, batch, (0.0, 1.0 / size))
        data = [i for i in range(len(shape)) if i not in cp]
        if len(data) != 2:
            raise PresetError(
                f"preset 'hsdp' needs a 2-D (replicate, shard) mesh, e.g. dims "
                f"['dp_replicate', 'dp_shard'] (and optionally a {CP_DIM!r} dim); got "
                f"{mesh_desc}; use 'fsdp' on a 1-D mesh"
            )
        # parameters sharded over the shard dim and replicated over the replicate dim (and
        # cp): every GPU holds exactly 1/shard of them
        layout = tuple("S(0)" if i == data[1] else "R" for i in range(len(shape)))
        return PresetConstraints(name, batch, None, parameter_layout=layout)

    if not tp:
        raise PresetError(
            f"preset {name!r} needs a mesh dim named {TP_DIM!r} (the tensor-"
            f"parallel dim), got {mesh_desc}; e.g. dim names "
            f"{list(default_dim_names(name, len(shape)))}"
        )
    t = tp[0]
    batch = tuple("R" if i == t else "S(0)" for i in range(len(shape)))
    if name == "tp":
        # sharded over tp only: each GPU holds 1/tp of the parameters, no less (that would
        # mean sharding over a data dim too) and no more
        return PresetConstraints(name, batch, _band(shape[t]))
    if len(shape) < 2:
        raise PresetError(
            f"preset 'fsdp+tp' needs a data-parallel dim besides {TP_DIM!r}, "
            f"e.g. a 2-D mesh with dims ['dp', 'tp']; got {mesh_desc}; use "
            "'tp' on a 1-D tensor-parallel mesh"
        )
    return PresetConstraints(name, batch, (0.0, 1.0 / size))


def _band(k: int) -> tuple[float, float]:
    """Parameters sharded k ways: 1/k per GPU, up to 2% more (module docstring)."""
    return (1.0 / k, min(1.0, BAND_SLACK / k))


def default_dim_names(name: str | None, ndim: int) -> tuple[str, ...]:
    """Dim names that fit ``name`` on an ``ndim``-D mesh (used by `autoshard demo`)."""
    if name in ("tp", "fsdp+tp"):
        data = ("dp",) if ndim == 2 else tuple(f"dp{i}" for i in range(ndim - 1))
        return data + (TP_DIM,)
    if ndim == 1:
        return ("dp",)
    if ndim == 2:
        return ("dp_replicate", "dp_shard") if name in ("hsdp", "ddp", "fsdp") else ("dp", "tp")
    return tuple(f"d{i}" for i in range(ndim))


def input_layouts(preset: PresetConstraints, input_shapes: Sequence[Sequence[int] | None]):
    """One layout (list of placement strings) per input: the batch layout for tensors with a
    batch dim, and with a cp dim the sequence layout for those with a sequence dim too; None
    (left to the planner) for scalars and non-tensors."""

    def one(shape):
        if shape is None or len(shape) < 1:
            return None
        return list(preset.sequence_layout if len(shape) >= 2 else preset.batch_layout)

    return [one(shape) for shape in input_shapes]


def parameter_layout(preset: PresetConstraints, shape: Sequence[int]) -> list[str] | None:
    """The preset's pinned layout of a parameter of ``shape`` (None: not pinned)."""
    if preset.parameter_layout is None:
        return None
    return ["R" if p.startswith("S(") and len(shape) == 0 else p for p in preset.parameter_layout]


# ---- the AutoParallel side --------------------------------------------------------------
def apply_preset(autop, name: str | None) -> None:
    """Add preset ``name``'s constraints to an entered AutoParallel (after tracing). Called
    by AutoParallel itself; the user's own constraints may follow (a later
    add_parameter_memory_constraint replaces the preset's bounds)."""
    if name is None:
        return
    from torch.distributed.tensor import Replicate, Shard

    mesh = autop.mesh
    preset = resolve(name, tuple(mesh.shape), mesh.mesh_dim_names)
    step = autop.step
    shapes = [
        step.input_metas[i][0] if name_ is not None else None
        for i, name_ in enumerate(step.input_nodes)
    ]
    to_placement = {"S(0)": Shard(0), "S(1)": Shard(1), "R": Replicate()}
    autop.add_input_constraints(
        [
            None if layout is None else tuple(to_placement[p] for p in layout)
            for layout in input_layouts(preset, shapes)
        ]
    )
    if preset.parameter_memory is None:
        autop.remove_parameter_memory_constraint()
    else:
        autop.add_parameter_memory_constraint(*preset.parameter_memory)
    for placeholder in step.param_fqns:
        layout = parameter_layout(preset, step.placeholder(placeholder).meta["val"].shape)
        if layout is not None:
            autop.add_node_constraint(placeholder, tuple(to_placement[p] for p in layout))


def check_preset(name: str | None, mesh) -> str | None:
    """Validate ``name`` against a DeviceMesh before tracing (so a typo fails at once)."""
    if name is not None:
        resolve(name, tuple(mesh.shape), mesh.mesh_dim_names)
    return name


def check_auto_parallel_args(
    name: str | None, sample_layouts: list, parameter_memory_budget
) -> None:
    """auto_parallel(preset=...): the preset decides input layouts and the parameter budget,
    so DTensor samples (placements of their own) or a budget would be ignored: refused."""
    if name is None:
        return
    if any(layout is not None for layout in sample_layouts):
        raise PresetError(
            f"auto_parallel: preset={name!r} sets the input layouts; pass plain "
            "tensors as sample_inputs (global shapes), not DTensors, or drop "
            "the preset"
        )
    if parameter_memory_budget is not None:
        raise PresetError(
            f"auto_parallel: preset={name!r} sets the parameter memory budget; "
            "leave parameter_memory_budget out, or drop the preset"
        )


# ---- the graph JSON side (`autoshard plan GRAPH.json --preset ...`) ------------------------
def graph_options(preset: PresetConstraints, graph: dict, base: PlannerOptions) -> PlannerOptions:
    """``base`` with the preset's constraints for a traced graph JSON: input constraints by
    placeholder name, parameter pins and the parameter memory bounds."""
    inputs = [
        n
        for n in graph.get("nodes", [])
        if n.get("op") == "placeholder" and n.get("role") == "input"
    ]
    shapes = [((n.get("outputs") or [None])[0] or {}).get("shape") for n in inputs]
    layouts = input_layouts(preset, shapes)
    pins = {}
    for n in graph.get("nodes", []):
        if n.get("op") == "placeholder" and n.get("role") == "parameter":
            layout = parameter_layout(
                preset, ((n.get("outputs") or [{}])[0] or {}).get("shape", [])
            )
            if layout is not None:
                pins[n["name"]] = layout
    memory = preset.parameter_memory
    return base.replace(
        input_constraints={n["name"]: l for n, l in zip(inputs, layouts) if l is not None},
        node_constraints=pins,
        parameter_memory=None if memory is None else tuple(memory),
    )
