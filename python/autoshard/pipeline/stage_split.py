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
