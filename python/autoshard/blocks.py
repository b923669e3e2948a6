"""Repeated blocks by name: a module path or parameter name up to its first numeric part
(``layers.3.attention.wq`` -> ``layers.3``). The gather buckets of the program
(program/passes/overlap.py: one bucket per block, as FSDP2 wraps each block) and the plan's
per-layer view (planning/plan_layers.py) group by it; the C++ report counts blocks the same
way (count_blocks)."""

from __future__ import annotations


def block_prefix(dotted: str) -> str | None:
    """``dotted`` up to and including its first all-digit part; None without one."""
    parts = dotted.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None
