"""Numeric validation of the op sharding rules, on CPU, with no process group.

For every op node of a real joint graph and every strategy the rules offer on a mesh, the
ranks are simulated in one process: each rank's local inputs are cut from the node's real
global input values per the strategy's input layouts, the op runs per rank on those local
arguments, the local outputs are put back together per the output layouts and compared with
the op's unsharded result. A wrong rule (a Partial kept through a non-linear op, a shard on
the reduced dim, ...) shows up as a mismatch.

How a layout is simulated (docs/formats.md section 2), mesh dim 0 first, each mesh dim
splitting the piece the previous ones left (so two mesh dims sharding one tensor dim split it
left to right):
- ``S(d)``: torch.chunk semantics (ceil-sized chunks, trailing ranks may be empty);
- ``R``: the same piece on every rank (checked to be equal again when it is an output);
- ``P(sum)`` / ``P(avg)``: random terms plus a remainder on one random rank, summing
  (averaging) to the piece;
- ``P(max)`` / ``P(min)``: every element attained on one random rank, strictly below (above)
  it on the others.
Outputs are put back in the reverse order (last mesh dim first): cat, equality check, or the
reduction.

Non-tensor arguments that carry GLOBAL sizes (view/expand sizes, factory sizes, new_* sizes,
the input sizes of slice/select backward) are replaced per rank with the rank's local output
shape, as a runtime running the op on local shards would have to do.

Entry points: ``capture_model`` / ``capture_function`` (graph + real values), then
``validate`` (a ``ValidationReport`` with ``summary()``).
"""

from __future__ import annotations

import json
import math
import operator
import random
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from autoshard._testing.capture import (  # noqa: F401 (captures, read through this module too)
    UNINITIALISED_OPS,
    CapturedGraph,
    ValidationSetupError,
    capture_function,
    capture_model,
    enumerate_strategies,
    export_graph,
)
from autoshard.ops import context_parallel

Coord = tuple

# Ops that draw random numbers: a per-rank run cannot reproduce the unsharded draw.
RANDOM_OPS = {
    "aten.native_dropout.default",
    "aten.rand.default",
    "aten.randn.default",
    "aten.rand_like.default",
    "aten.randn_like.default",
    "aten.bernoulli.default",
    "aten.bernoulli.p",
    "aten.randint.default",
    "aten.randint.low",
    "aten.randperm.default",
    "aten.normal.Tensor_float",
    "aten.uniform.default",
    "aten.multinomial.default",
}
# CPU kernels that crash the process (SIGFPE) on an empty local block: never run them there.
CRASH_ON_EMPTY_OPS = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
}
# Ops with a positional argument that is the GLOBAL output shape: op -> (size arg, stride arg).
OUTPUT_SHAPE_ARGS = {
    "aten.view.default": (1, None),
    "aten._unsafe_view.default": (1, None),
    "aten.view_copy.default": (1, None),
    "aten.reshape.default": (1, None),
    "aten.expand.default": (1, None),
    "aten.expand_copy.default": (1, None),
    "aten.new_zeros.default": (1, None),
    "aten.new_ones.default": (1, None),
    "aten.new_empty.default": (1, None),
    "aten.new_full.default": (1, None),
    "aten.new_empty_strided.default": (1, 2),
    "aten.zeros.default": (0, None),
    "aten.ones.default": (0, None),
    "aten.empty.memory_format": (0, None),
    "aten.full.default": (0, None),
    "aten.empty_strided.default": (0, 1),
    "aten.slice_backward.default": (1, None),
    "aten.select_backward.default": (1, None),
}


# ----------------------------------------------------------------------------- capture


# ----------------------------------------------------------------------------- layouts


def parse_placement(text: str) -> tuple:
    """``"R"`` -> ("R",), ``"S(1)"`` -> ("S", 1), ``"P(sum)"`` -> ("P", "sum")."""
    if text == "R":
        return ("R",)
    if text.startswith("S(") and text.endswith(")"):
        return ("S", int(text[2:-1]))
    if text.startswith("P(") and text.endswith(")") and text[2:-1] in ("sum", "avg", "max", "min"):
        return ("P", text[2:-1])
    raise ValidationSetupError(f"unknown placement {text!r}")


def layout_compact(layout: Sequence[str] | None) -> str:
    return "None" if layout is None else "".join(layout)


def strategy_str(strategy: dict) -> str:
    ins = ",".join(layout_compact(l) for l in strategy["inputs"])
    outs = ",".join(layout_compact(l) for l in strategy["outputs"])
    return f"{ins} -> {outs}"


def chunk_bounds(size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, length) of chunk ``index`` when ``size`` is split in ``parts`` like
    torch.chunk (ceil-sized chunks; trailing chunks may be empty)."""
    chunk = -(-size // parts) if size > 0 else 0
    start = min(chunk * index, size)
    return start, max(0, min(size, start + chunk) - start)


def local_shape(
    shape: Sequence[int], layout: Sequence[str], mesh: Sequence[int], coord: Coord
) -> list[int]:
    out = list(shape)
    for i, text in enumerate(layout):
        p = parse_placement(text)
        if p[0] == "S":
            out[p[1]] = chunk_bounds(out[p[1]], mesh[i], coord[i])[1]
    return out


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _finite_abs(t: torch.Tensor) -> torch.Tensor:
    """|t| with non-finite entries as 0, in float64."""
    a = t.abs().double() if not t.is_complex() else t.abs().double()
    return (
        torch.where(torch.isfinite(a), a, torch.zeros((), dtype=torch.float64))
        if _is_float(t)
        else a
    )


def _noise_scale(t: torch.Tensor) -> float:
    if t.numel() == 0 or t.dtype == torch.bool:
        return 1.0
    return float(_finite_abs(t).mean()) + 0.5


def _partial_noise_scale(piece: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element: the size of the random partial sum terms and the most a term may hold.
    The size follows the element's own magnitude, at least the piece's median magnitude (its
    mean when most are zero, 0.5 for zeros), so a tiny piece scaled up later
    (x * rsqrt(variance)) keeps its precision and huge entries (finfo.min attention masks)
    do not swamp the others; the bound keeps every term and their sum inside the dtype's
    range."""
    mag = _finite_abs(piece)
    floor = float(mag.median()) if mag.numel() else 0.0
    if floor == 0.0:
        floor = float(mag.mean()) if mag.numel() else 0.0
    floor = floor if floor > 0 else 0.5
    big = math.inf if piece.is_complex() else torch.finfo(piece.dtype).max
    room = ((big - mag) / (n + 1)).clamp(min=0.0)
    return torch.minimum(mag.clamp(min=floor), room), room


def _split_partial(
    piece: torch.Tensor, op: str, n: int, gen: torch.Generator
) -> list[torch.Tensor]:
    if n == 1:
        return [piece]
    owner = int(torch.randint(n, (), generator=gen))
    if op in ("sum", "avg"):
        if piece.dtype == torch.bool:  # sum/avg of bools: an OR with the value on the owner
            terms = [piece & (torch.rand(piece.shape, generator=gen) < 0.5) for _ in range(n)]
            terms[owner] = piece.clone()
            return terms
        if _is_float(piece):
            # noise of the piece's magnitude, but never pushing a term past the dtype's range
            # (attention masks hold finfo.min: their terms stay at the value)
            scale, room = _partial_noise_scale(piece, n)
            noise = [
                (torch.randn(piece.shape, generator=gen, dtype=torch.float64) * scale)
                .clamp(-room, room)
                .to(piece.dtype)
                for _ in range(n)
            ]
        else:
            noise = [
                torch.randint(-5, 6, piece.shape, generator=gen).to(piece.dtype) for _ in range(n)
            ]
        # sum: the noise terms and the rest on the owner; avg: the piece plus noise terms that
        # cancel out (the average is the piece without forming n * piece, which may overflow)
        rest = sum(noise[j] for j in range(n) if j != owner)
        base = piece if op == "avg" else torch.zeros_like(piece)
        terms = [base + noise[j] for j in range(n)]
        terms[owner] = piece - rest
        return terms
    # max / min: each element's owner holds the value, the others hold less (more)
    owners = torch.randint(n, piece.shape, generator=gen)
    sign = -1 if op == "max" else 1
    terms = []
    for j in range(n):
        if piece.dtype == torch.bool:
            other = torch.zeros_like(piece) if op == "max" else torch.ones_like(piece)
        elif _is_float(piece):
            delta = torch.rand(piece.shape, generator=gen, dtype=torch.float64) + 0.1
            other = (piece.double() + sign * delta * _noise_scale(piece)).to(piece.dtype)
        else:
            other = piece + sign * torch.randint(1, 4, piece.shape, generator=gen).to(piece.dtype)
        terms.append(torch.where(owners == j, piece, other))
    return terms


def split_value(
    value: torch.Tensor, layout: Sequence[str], mesh: Sequence[int], gen: torch.Generator
) -> dict[Coord, torch.Tensor]:
    """Each rank's local tensor (contiguous, its own storage) of a global value."""
    pieces: dict[Coord, torch.Tensor] = {(): value}
    for i, text in enumerate(layout):
        p = parse_placement(text)
        n = mesh[i]
        nxt: dict[Coord, torch.Tensor] = {}
        for coord, piece in pieces.items():
            if p[0] == "R":
                parts = [piece] * n
            elif p[0] == "S":
                if p[1] >= piece.dim():
                    raise ValidationSetupError(f"S({p[1]}) on a tensor of rank {piece.dim()}")
                parts = [
                    piece.narrow(p[1], *chunk_bounds(piece.shape[p[1]], n, j)) for j in range(n)
                ]
            else:
                parts = _split_partial(piece, p[1], n, gen)
            for j, part in enumerate(parts):
                nxt[coord + (j,)] = part
        pieces = nxt
    return {c: t.contiguous().clone() for c, t in pieces.items()}


@dataclass
class _Mismatch:
    error: float
    message: str


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return float((a != b).sum())
    a64, b64 = a.double() if not a.is_complex() else a, b.double() if not b.is_complex() else b
    both_nonfinite = ~torch.isfinite(a64) & ~torch.isfinite(b64)
    same_special = both_nonfinite & ((a64 == b64) | (torch.isnan(a64) & torch.isnan(b64)))
    diff = (a64 - b64).abs()
    diff = torch.where(same_special, torch.zeros_like(diff), diff)
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    return float(diff.max())


_RTOL = {
    torch.float64: 1e-9,
    torch.complex128: 1e-9,
    torch.float32: 2e-4,
    torch.complex64: 2e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 3e-2,
}


def tolerance(reference: torch.Tensor, precision: torch.dtype | None = None) -> float:
    """Allowed max abs error: exact for integers and bools, relative to the reference's
    magnitude for floats (rank-local partial terms reorder the sums). ``precision``: the
    least precise floating dtype the op computed in (e.g. float32 inputs of a float64 cast)."""
    if not _is_float(reference):
        return 0.0
    rtol = max(_RTOL.get(reference.dtype, 2e-4), _RTOL.get(precision, 0.0))
    scale = float(_finite_abs(reference).max()) if reference.numel() else 0.0
    return rtol * (scale + 1.0)


def _combine(
    parts: list[torch.Tensor], text: str, tol: float | None, mismatches: list[_Mismatch]
) -> torch.Tensor:
    p = parse_placement(text)
    if p[0] == "S":
        return torch.cat(parts, dim=p[1])
    if p[0] == "R":
        first = parts[0]
        for j, other in enumerate(parts[1:], start=1):
            if other.shape != first.shape:
                mismatches.append(
                    _Mismatch(
                        math.inf,
                        f"R output: rank shapes differ "
                        f"{list(first.shape)} vs {list(other.shape)}",
                    )
                )
                continue
            if tol is None:  # uninitialised values: only shapes must agree
                continue
            err = _max_abs_diff(first, other)
            if err > tol:
                mismatches.append(_Mismatch(err, f"R output differs between ranks (max {err:.3g})"))
        return first
    stacked = torch.stack(parts)
    op = p[1]
    if stacked.dtype == torch.bool:
        return stacked.all(0) if op == "min" else stacked.any(0)
    if op == "sum":
        return stacked.sum(0).to(parts[0].dtype)
    if op == "avg":
        if stacked.is_complex():
            return stacked.mean(0)
        if _is_float(stacked):  # in float64: a sum of finfo.min mask entries must not overflow
            return stacked.double().mean(0).to(parts[0].dtype)
        return stacked.double().sum(0) / len(parts)
    return stacked.amax(0) if op == "max" else stacked.amin(0)


def combine_value(
    locals_: dict[Coord, torch.Tensor],
    layout: Sequence[str],
    mesh: Sequence[int],
    tol: float | None,
    mismatches: list[_Mismatch],
) -> torch.Tensor:
    """The global value the ranks' outputs stand for (inverse of split_value). Replicated
    outputs must agree between ranks within ``tol`` (None: values not compared)."""
    pieces = dict(locals_)
    for i in range(len(mesh) - 1, -1, -1):
        groups: dict[Coord, list] = {}
        for coord in sorted(pieces):
            groups.setdefault(coord[:i], []).append(pieces[coord])
        pieces = {c: _combine(parts, layout[i], tol, mismatches) for c, parts in groups.items()}
    return pieces[()]


# ----------------------------------------------------------------------------- validation


@dataclass
class Failure:
    graph: str
    mesh: tuple
    node: str
    op: str
    strategy: str
    max_error: float
    message: str

    def __str__(self) -> str:
        return (
            f"{self.graph} mesh={list(self.mesh)} {self.node} ({self.op}) [{self.strategy}]: "
            f"max error {self.max_error:.3g}; {self.message}"
        )


@dataclass
class ValidationReport:
    graphs: list[str] = field(default_factory=list)
    meshes: list[tuple] = field(default_factory=list)
    nodes_checked: int = 0
    duplicates: int = 0  # nodes skipped as equal to a checked one (same op, shapes, args)
    strategies_checked: int = 0
    strategies_offered: int = 0  # before sampling
    ops: set = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    skipped: list[tuple] = field(default_factory=list)  # (graph, node, op, reason)
    unsupported: list[tuple] = field(default_factory=list)  # (graph, op, node)
    passed: dict = field(default_factory=dict)  # (graph, mesh, node, strategy str) -> True

    def merge(self, other: "ValidationReport") -> None:
        self.graphs += [g for g in other.graphs if g not in self.graphs]
        self.meshes += [m for m in other.meshes if m not in self.meshes]
        self.nodes_checked += other.nodes_checked
        self.duplicates += other.duplicates
        self.strategies_checked += other.strategies_checked
        self.strategies_offered += other.strategies_offered
        self.ops |= other.ops
        self.failures += other.failures
        self.skipped += other.skipped
        self.unsupported += other.unsupported
        self.passed.update(other.passed)

    def ok(self) -> bool:
        return not self.failures and not self.unsupported

    def failed_strategies(self, node: str) -> list[str]:
        return [f.strategy for f in self.failures if f.node == node]

    def summary(self, max_failures: int = 40) -> str:
        lines = [
            f"rule validation: {len(self.graphs)} graph(s) {', '.join(self.graphs)}; meshes "
            f"{', '.join(str(list(m)) for m in self.meshes)}",
            f"  {self.nodes_checked} op nodes ({len(self.ops)} distinct ops) x strategies: "
            f"{self.strategies_checked} validated (of {self.strategies_offered} offered), "
            f"{len(self.failures)} failed; {self.duplicates} nodes equal to a checked one",
        ]
        skipped_ops = sorted({(s[2], s[3]) for s in self.skipped})
        for op, reason in skipped_ops:
            lines.append(f"  skipped {op}: {reason}")
        missing = sorted({(u[1], u[0]) for u in self.unsupported})
        for op, graph in missing:
            lines.append(f"  NO RULE: {op} (in {graph})")
        for f in self.failures[:max_failures]:
            lines.append(f"  FAIL {f}")
        if len(self.failures) > max_failures:
            lines.append(f"  ... {len(self.failures) - max_failures} more failures")
        return "\n".join(lines)


def tensor_ref_nodes(node: fx.Node) -> list[fx.Node]:
    """The node's tensor references in args then kwargs, depth first (the order of the
    strategies' ``inputs``, docs/formats.md section 3), as the runtime walks them."""
    from autoshard.program.interpreter import tensor_refs

    return tensor_refs(node.args, node.kwargs)


def _localise_sizes(op: str, args: tuple, out_local_shape: list[int] | None) -> tuple:
    from autoshard.program.interpreter import contiguous_stride

    spec = OUTPUT_SHAPE_ARGS.get(op)
    if spec is None or out_local_shape is None:
        if op == "aten.embedding_dense_backward.default" and out_local_shape is not None:
            args = list(args)
            args[2] = out_local_shape[0]  # num_weights: the rows of the (local) weight gradient
            return tuple(args)
        return args
    size_at, stride_at = spec
    args = list(args)
    args[size_at] = list(out_local_shape)
    if stride_at is not None and stride_at < len(args):
        args[stride_at] = list(contiguous_stride(out_local_shape))
    return tuple(args)


def _outputs_of(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _node_seed(graph: str, node: str, extra: str = "") -> int:
    return zlib.crc32(f"{graph}/{node}/{extra}".encode())


def validate_node(
    captured: CapturedGraph,
    node: fx.Node,
    strategies: list[dict],
    mesh: Sequence[int],
    report: ValidationReport,
) -> None:
    op = str(node.target)
    refs = tensor_ref_nodes(node)
    global_in = {r.name: captured.values[r.name] for r in refs}
    reference = _outputs_of(captured.values[node.name])
    coords = [tuple(c) for c in _all_coords(mesh)]
    float_inputs = [
        v.dtype for v in global_in.values() if isinstance(v, torch.Tensor) and _is_float(v)
    ]
    precision = max(float_inputs, key=lambda d: _RTOL.get(d, 0.0)) if float_inputs else None
    split_cache: dict[tuple, dict[Coord, torch.Tensor]] = {}
    for strategy in strategies:
        for layout in list(strategy["inputs"]) + [o for o in strategy["outputs"] if o is not None]:
            if not isinstance(layout, (list, tuple)) or len(layout) != len(mesh):
                raise ValidationSetupError(
                    f"node {node.name}: strategy {strategy!r} has a layout "
                    f"{layout!r} that is not one placement per mesh dim"
                )
        sname = strategy_str(strategy)
        report.strategies_checked += 1
        mismatches: list[_Mismatch] = []
        try:
            if len(strategy["inputs"]) != len(refs):
                raise ValidationSetupError(
                    f"strategy has {len(strategy['inputs'])} input layouts for {len(refs)} "
                    "tensor references"
                )
            per_input = []
            for k, (r, layout) in enumerate(zip(refs, strategy["inputs"])):
                key = (k, tuple(layout))
                if key not in split_cache:
                    gen = torch.Generator().manual_seed(
                        _node_seed(captured.name, node.name, str(key))
                    )
                    split_cache[key] = split_value(global_in[r.name], layout, mesh, gen)
                per_input.append(split_cache[key])
            out_layouts = strategy["outputs"]
            ref0 = reference[0] if isinstance(reference[0], torch.Tensor) else None
            local_outs: list[dict[Coord, Any]] = [dict() for _ in reference]
            for c in coords:
                if op in CRASH_ON_EMPTY_OPS and any(
                    per_input[k][c].numel() == 0 for k in range(len(refs))
                ):
                    raise ValidationSetupError(
                        f"rank {c} gets an empty block, on which the CPU " "kernel crashes"
                    )
                local_of = {r.name: per_input[k][c] for k, r in enumerate(refs)}
                args = fx.node.map_arg(node.args, lambda n: local_of[n.name])
                kwargs = dict(fx.node.map_arg(node.kwargs, lambda n: local_of[n.name]))
                out_shape = None
                if ref0 is not None and out_layouts and out_layouts[0] is not None:
                    out_shape = local_shape(ref0.shape, out_layouts[0], mesh, c)
                args = _localise_sizes(op, tuple(args), out_shape)
                if context_parallel.needs_local_call(op, args, strategy["inputs"], None):
                    # attention on a block of queries: the runtime's local call
                    q_at = context_parallel.q_input(op)
                    seq = global_in[refs[q_at].name].shape[context_parallel.SEQ_DIM]
                    q_start, k_start = context_parallel.shard_starts(
                        op, strategy["inputs"], mesh, lambda d, c=c: c[d], seq
                    )
                    result = context_parallel.local_call_at_positions(
                        op, args, kwargs, seq, None, q_start, k_start, node.target
                    )
                else:
                    result = node.target(*args, **kwargs)
                result = _outputs_of(result)
                if len(result) != len(reference):
                    raise ValidationSetupError(f"rank {c} returned {len(result)} outputs")
                for k, v in enumerate(result):
                    local_outs[k][c] = v
            worst = 0.0
            for k, ref in enumerate(reference):
                layout = out_layouts[k] if k < len(out_layouts) else None
                if layout is None or not isinstance(ref, torch.Tensor):
                    continue
                tol = None if op in UNINITIALISED_OPS else tolerance(ref, precision)
                got = combine_value(local_outs[k], layout, mesh, tol, mismatches)
                if tuple(got.shape) != tuple(ref.shape):
                    mismatches.append(
                        _Mismatch(
                            math.inf,
                            f"output {k}: shape {list(got.shape)}" f" != {list(ref.shape)}",
                        )
                    )
                    continue
                if op in UNINITIALISED_OPS:
                    continue
                err = _max_abs_diff(got, ref)
                worst = max(worst, err)
                if err > tol:
                    mismatches.append(
                        _Mismatch(
                            err,
                            f"output {k} ({layout_compact(layout)}) "
                            f"differs from the unsharded op (tolerance "
                            f"{tol:.3g})",
                        )
                    )
        except ValidationSetupError as e:
            mismatches.append(_Mismatch(math.inf, str(e)))
        except Exception as e:  # the op refused its local arguments: the rule is wrong
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            mismatches.append(
                _Mismatch(math.inf, f"local run raised {type(e).__name__}: {msg[:200]}")
            )
        if mismatches:
            worst = max(m.error for m in mismatches)
            report.failures.append(
                Failure(
                    captured.name,
                    tuple(mesh),
                    node.name,
                    op,
                    sname,
                    worst,
                    "; ".join(dict.fromkeys(m.message for m in mismatches)),
                )
            )
        else:
            report.passed[(captured.name, tuple(mesh), node.name, sname)] = True


def _all_coords(mesh: Sequence[int]):
    coords = [()]
    for n in mesh:
        coords = [c + (j,) for c in coords for j in range(n)]
    return coords


StrategyHook = Callable[[dict, list[dict]], list[dict]]


def node_signature(node_json: dict, nodes_by_name: dict[str, dict]) -> str:
    """What the rules see of a node: op, argument values with every tensor reference
    replaced by its shape and dtype, output metas. Equal signatures get equal strategies."""

    def sub(v):
        if isinstance(v, dict) and "ref" in v:
            return nodes_by_name[v["ref"]]["outputs"][v["index"]]
        if isinstance(v, list):
            return [sub(x) for x in v]
        return v

    return json.dumps(
        [
            node_json["op"],
            sub(node_json.get("args", [])),
            {k: sub(v) for k, v in node_json.get("kwargs", {}).items()},
            node_json["outputs"],
        ],
        sort_keys=True,
    )


def validate(
    captured: CapturedGraph,
    mesh: Sequence[int],
    *,
    max_strategies_per_node: int | None = None,
    dedupe: bool = True,
    extra_strategies: StrategyHook | None = None,
    ops: set[str] | None = None,
    seed: int = 0,
) -> ValidationReport:
    """Validates every strategy of every op node of ``captured`` on ``mesh``.

    ``max_strategies_per_node``: validate a deterministic random sample of that many
    strategies per node (all-Replicate always included) - for large meshes.
    ``extra_strategies(node_json, strategies) -> more strategies``: strategies to validate in
    addition to the rules' own (planted faults in tests).
    ``ops``: only nodes of these ops.
    ``dedupe``: validate only the first of nodes with equal signatures (the same op on the
    same shapes and arguments, e.g. in repeated layers); the others count as ``duplicates``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # tiny tensors: thread start-up and contention cost more than they save
    try:
        return _validate(
            captured,
            tuple(int(m) for m in mesh),
            max_strategies_per_node,
            dedupe,
            extra_strategies,
            ops,
            seed,
        )
    finally:
        torch.set_num_threads(threads)


def _validate(
    captured: CapturedGraph,
    mesh: tuple,
    max_strategies_per_node: int | None,
    dedupe: bool,
    extra_strategies: StrategyHook | None,
    ops: set[str] | None,
    seed: int,
) -> ValidationReport:
    enumerated = enumerate_strategies(captured.graph, mesh)
    report = ValidationReport(graphs=[captured.name], meshes=[mesh])
    for u in enumerated["unsupported"]:
        report.unsupported.append((captured.name, u["op"], u["node"]))
    node_json = {n["name"]: n for n in captured.graph["nodes"]}
    unsupported_nodes = {u["node"] for u in enumerated["unsupported"]}
    seen_signatures: set[str] = set()
    for node in captured.gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        op = str(node.target)
        if ops is not None and op not in ops:
            continue
        if node.name in unsupported_nodes:
            continue
        if op in RANDOM_OPS:
            report.skipped.append(
                (
                    captured.name,
                    node.name,
                    op,
                    "random op: a per-rank run cannot " "reproduce the unsharded draw",
                )
            )
            continue
        if dedupe:
            sig = node_signature(node_json[node.name], node_json)
            if sig in seen_signatures:
                report.duplicates += 1
                continue
            seen_signatures.add(sig)
        strategies = list(enumerated["nodes"][node.name])
        report.strategies_offered += len(strategies)
        if max_strategies_per_node is not None and len(strategies) > max_strategies_per_node:
            rng = random.Random(_node_seed(captured.name, node.name, f"sample{seed}"))
            strategies = [strategies[0]] + rng.sample(strategies[1:], max_strategies_per_node - 1)
        if extra_strategies is not None:
            strategies += extra_strategies(node_json[node.name], strategies)
        report.nodes_checked += 1
        report.ops.add(op)
        validate_node(captured, node, strategies, mesh, report)
    return report


def validate_all(
    captures: Sequence[CapturedGraph], meshes: Sequence[Sequence[int]], **kwargs
) -> ValidationReport:
    total = ValidationReport()
    for cap in captures:
        for mesh in meshes:
            total.merge(validate(cap, mesh, **kwargs))
    return total


# ----------------------------------------------------------------------------- standard models


def standard_captures(
    names: Sequence[str] = ("llama3", "moe", "gpt2"), seed: int = 0
) -> list[CapturedGraph]:
    """The validator's models (python/autoshard/testing/models_zoo.py), traced and run eagerly:
    ``llama3`` (2 layers, SDPA with GQA), ``moe`` (4 experts, top-2), ``deepseek_moe`` /
    ``deepseek_moe_sigmoid`` (DeepSeekMoEBlock: capacity-based dispatch with einsums, shared
    expert; softmax / sigmoid router), ``gpt2`` (transformers, 2 layers; needs the
    transformers package); the op-family cases of op_cases.py
    (``convolutions``, ``losses``, ``losses_raw``, ``histograms``, ``scatters``,
    ``grouped_mm``); ``hf:<family>``, a Hugging Face family of hf_zoo.py (``hf:mixtral``)."""
    from autoshard._testing import models_zoo as Z
    from autoshard._testing import op_cases

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name in names:
        if name == "llama3":
            model, inputs = Z.llama3_small("sdpa"), (
                torch.randint(0, 64, (2, 6), generator=gen),
                torch.randint(0, 64, (2, 6), generator=gen),
            )
        elif name == "llama3_manual":
            model, inputs = Z.llama3_small("manual"), (
                torch.randint(0, 64, (2, 6), generator=gen),
                torch.randint(0, 64, (2, 6), generator=gen),
            )
        elif name == "moe":
            model, inputs = Z.MoEBlock(n_experts=4, top_k=2), (
                torch.randn(2, 6, 32, generator=gen),
                torch.randn(2, 6, 32, generator=gen),
            )
        elif name in ("deepseek_moe", "deepseek_moe_sigmoid"):
            # 4 groups of 6 tokens, capacity 3 per expert and group: some tokens dropped
            score = "sigmoid" if name.endswith("sigmoid") else "softmax"
            model = Z.DeepSeekMoEBlock(
                dim=16, hidden=8, n_experts=4, top_k=2, capacity_factor=0.75, score_func=score
            )
            inputs = (torch.randn(4, 6, 16, generator=gen), torch.randn(4, 6, 16, generator=gen))
        elif name == "gpt2":
            model, inputs = Z.GPT2LM(), (
                torch.randint(0, 128, (2, 8), generator=gen),
                torch.randint(0, 128, (2, 8), generator=gen),
            )
        elif name in op_cases.CASES:
            out.append(op_cases.capture(name, seed))
            continue
        elif name.startswith("hf:"):
            out.append(op_cases.hf_family(name[3:], seed))
            continue
        else:
            raise ValueError(
                f"unknown model {name!r}: expected llama3, llama3_manual, moe, "
                f"deepseek_moe, deepseek_moe_sigmoid, gpt2, "
                f"{', '.join(op_cases.CASES)} or hf:<family>"
            )
        out.append(capture_model(name, model, inputs, seed=seed))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoshard._testing.validate [--models llama3,moe,gpt2] [--meshes 2,4,2x2,2x2x2]
    [--sample N]``: validates every rule of the standard models and prints the summary."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m autoshard._testing.validate", description=main.__doc__
    )
    ap.add_argument("--models", default="llama3,moe,gpt2")
    ap.add_argument("--meshes", default="2,4,2x2,2x2x2")
    ap.add_argument(
        "--sample", type=int, default=None, help="strategies per node to validate (default: all)"
    )
    args = ap.parse_args(argv)
    captures = standard_captures(args.models.split(","))
    meshes = [tuple(int(x) for x in m.split("x")) for m in args.meshes.split(",")]
    report = validate_all(captures, meshes, max_strategies_per_node=args.sample)
    print(report.summary(max_failures=200))
    return 0 if report.ok() else 1


if __name__ == "__main__":
    raise SystemExit(main())
