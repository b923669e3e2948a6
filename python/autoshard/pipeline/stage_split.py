"""Which layers each pipeline stage holds: a model's stack of repeated layers cut at block
boundaries into contiguous ranges, one per stage (the first stage also holds what comes
before the stack, the last what comes after it: stage_modules.py)."""

from __future__ import annotations


def layer_ranges(
    n_layers: int, n_stages: int, split_points: list[int] | None = None
) -> list[range]:
    """The layers of each of ``n_stages`` stages. ``split_points``: the index of the first
    layer of every stage but the first (``n_stages - 1`` increasing indices in
    ``1..n_layers-1``); without them, the layers are spread by count, the first stages
    taking one more where they do not divide evenly."""
    if n_stages < 1:
        raise ValueError(f"pipeline: {n_stages} stages; at least 1 is needed")
    if split_points is None:
        if n_layers < n_stages:
            raise ValueError(
                f"pipeline: {n_layers} layers cannot fill {n_stages} stages "
                "(every stage needs at least one layer)"
            )
        base, extra = divmod(n_layers, n_stages)
        sizes = [base + (1 if s < extra else 0) for s in range(n_stages)]
        split_points, at = [], 0
        for size in sizes[:-1]:
            at += size
            split_points.append(at)
    points = list(split_points)
    if len(points) != n_stages - 1:
        raise ValueError(
            f"pipeline: {n_stages} stages need {n_stages - 1} split points, got {points}"
        )
    bounds = [0, *points, n_layers]
    for a, b in zip(bounds, bounds[1:]):
        if not a < b:
            raise ValueError(
                f"pipeline: split points {points} must increase strictly within "
                f"1..{n_layers - 1} (every stage needs at least one layer of {n_layers})"
            )
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def _matmul_parameters(module) -> int:
    """Elements of the module's matrices (weights of ndim 2): per token, a matmul forward
    costs 2 flops per element, its backward 4."""
    return sum(p.numel() for p in module.parameters() if p.ndim == 2)


def balanced_split_points(model, n_stages: int, seq_len: int) -> list[int]:
    """Split points that balance the stages' training FLOPs per token, the embedding's
    (a lookup: none) on the first stage and the output head's on the last (``model.output``:
    with a large vocabulary it costs several layers, which a split by count ignores), cut
    by the C++ core's exact split (``_core.balanced_split``). Each layer counts its matmuls
    (6 flops per weight element and token, forward and backward) and causal attention
    (6 * seq_len * dim flops per token: QK^T and PV over half the keys on average)."""
    from autoshard import _core

    dim = getattr(getattr(model, "cfg", None), "dim", 0)
    layers = [6.0 * _matmul_parameters(layer) + 6.0 * seq_len * dim for layer in model.layers]
    head = getattr(model, "output", None)
    last = 6.0 * _matmul_parameters(head) if head is not None else 0.0
    if len(layers) < n_stages:
        raise ValueError(
            f"pipeline: {len(layers)} layers cannot fill {n_stages} stages "
            "(every stage needs at least one layer)"
        )
    return list(_core.balanced_split(layers, n_stages, 0.0, last))[1:]
