"""Uneven shards in a lowered program: tensors whose local size differs by rank (a dim of
10 on 4 ranks is 3, 3, 3, 1). Where one program must serve every rank (torch's
``compile_on_one_rank``), and with ``dynamic=True`` as AutoParallel does, such dims are
traced as size symbols (hinted by this rank's size), so DTensor pads and unpads them by
sizes computed at run time. A program for every rank is only kept if nothing in it was
decided on the tracing rank's size: every shape guard the trace recorded must hold for
every rank's sizes."""

from __future__ import annotations

import contextlib
import itertools
from typing import Sequence

import torch

from autoshard.placements import layout_to_strs, local_shape

# mesh coordinates checked one by one below this many ranks; above, the first and last
# coordinate of each mesh dim (the largest and smallest chunk) in every combination
_ALL_COORDINATES_UP_TO = 4096


def _one_program_refused(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"compile_on_one_rank: {what}, so one program cannot serve every rank: pad that "
        "dimension to a multiple of the mesh size, pin an even layout (add_node_constraint), "
        "or lower per rank (compile_on_one_rank off)"
    )


class UnevenDims:
    """For each flat step input (position in ``flat``): its dims sharded unevenly, when
    ``symbolic``; nothing otherwise."""

    def __init__(self, runner, names: Sequence[str | None], positions: Sequence[int], symbolic):
        self.runner = runner
        self.names = names
        self.dims = {
            i: runner.placeholder_varying_dims(names[i]) if symbolic and names[i] else []
            for i in positions
        }

    def __bool__(self) -> bool:
        return any(self.dims.values())

    def described(self) -> str:
        i = next(i for i, dims in self.dims.items() if dims)
        name = self.names[i]
        return (
            f"input {name} of shape {list(self.runner.global_shape(name))} is sharded unevenly "
            f"(dims {self.dims[i]}) in layout {layout_to_strs(self.runner.placeholder_layout(name))}"
        )

    @contextlib.contextmanager
    def refusing_untraceable_collectives(self, one_rank: bool):
        """Turns torch's failure to trace an uneven collective for every rank (DTensor
        indexes a list by the runtime mesh coordinate) into a refusal that says why."""
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        try:
            yield
        except GuardOnDataDependentSymNode as e:
            if not (one_rank and self):
                raise
            raise _one_program_refused(
                f"{self.described()} and DTensor cannot redistribute it for every rank at "
                f"once ({str(e).splitlines()[0]})"
            ) from e

    def size_symbols(self, fakes: dict[int, torch.Tensor]) -> list[tuple]:
        """(symbol, input name, dim) of each uneven dim of the fake inputs, taken before
        tracing (a guard may later replace a symbol by the tracing rank's size)."""
        out = []
        for i, dims in self.dims.items():
            for d in dims:
                size = fakes[i].shape[d]
                if isinstance(size, torch.SymInt):
                    out.append((size.node.expr, self.names[i], d))
        return out

    def check_every_rank(self, symbols: list[tuple], shape_env) -> None:
        """Raises unless every shape guard the trace recorded on the uneven dims' symbols
        (``size_symbols``) holds for every rank's local sizes."""
        if not symbols:
            return
        mesh = self.runner.mesh
        placed = [
            (self.runner.global_shape(name), self.runner.placeholder_layout(name), d)
            for _, name, d in symbols
        ]
        # the symbols' values on each rank; ranks with the same values need one check
        distinct = {
            tuple(local_shape(shape, layout, mesh.shape, coord)[d] for shape, layout, d in placed)
            for coord in _coordinates(mesh.shape)
        }
        ours = [expr for expr, _, _ in symbols]
        our_symbols = set(ours)
        per_rank_sizes = [dict(zip(ours, values)) for values in sorted(distinct)]
        exprs = [g.expr for g in shape_env.guards]
        exprs += [sym - value for sym, value in shape_env.replacements.items()]
        for expr in exprs:
            if not (expr.free_symbols & our_symbols):
                continue
            for sizes in per_rank_sizes:
                got = expr.xreplace(sizes)
                holds = bool(got) if got.is_Boolean else got == 0
                if not holds:
                    raise _one_program_refused(
                        f"{self.described()} and the trace depends on the tracing rank's "
                        f"size ({expr} fails for sizes {sizes})"
                    )


def _coordinates(mesh_shape: Sequence[int]):
    total = 1
    for s in mesh_shape:
        total *= s
    if total <= _ALL_COORDINATES_UP_TO:
        return itertools.product(*(range(s) for s in mesh_shape))
    return itertools.product(*({0, s - 1} for s in mesh_shape))
