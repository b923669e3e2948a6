"""Two plans compared: their totals, per layer what time and parameter memory became, and
the nodes whose layouts differ with the cost each moved. Printed by `autoshard diff` and
returned by the sharding optimizer's ``diff_solutions``."""

from __future__ import annotations

from autoshard.planning.plan import Plan
from autoshard.planning.plan_layers import fmt_layout, layers, node_layer


def _ms(us) -> str:
    return f"{float(us) / 1e3:.3f} ms"


def diff_lines(a: Plan, b: Plan, limit: int = 20) -> list[str]:
    sa, sb = a.summary, b.summary
    out = ["totals (A -> B):"]
    for key, label in (
        ("total_us", "step"),
        ("compute_us", "compute"),
        ("comm_us", "communication"),
        ("exposed_comm_us", "exposed comm"),
        ("lower_bound_us", "lower bound"),
    ):
        x, y = getattr(sa, key), getattr(sb, key)
        out.append(f"  {label:<14} {_ms(x):>14} -> {_ms(y):>14}  ({(y - x) / 1e3:+.3f} ms)")
    pa, pb = sa.parameter_bytes_per_gpu, sb.parameter_bytes_per_gpu
    out.append(f"  {'params/GPU':<14} {pa / 2**20:>10.2f} MiB -> {pb / 2**20:>10.2f} MiB")
    la = {l.name: l for l in layers(a)}
    lb = {l.name: l for l in layers(b)}
    if a.node_info or b.node_info:
        out.append("per layer (time ms A -> B | params MiB/GPU A -> B):")
        for name in list(la) + [n for n in lb if n not in la]:
            x, y = la.get(name), lb.get(name)
            tx = (x.compute_us + x.comm_us) / 1e3 if x else 0.0
            ty = (y.compute_us + y.comm_us) / 1e3 if y else 0.0
            mx = x.param_bytes / 2**20 if x else 0.0
            my = y.param_bytes / 2**20 if y else 0.0
            if abs(tx - ty) > 1e-6 or abs(mx - my) > 1e-6:
                out.append(f"  {name:<20} {tx:10.3f} -> {ty:10.3f} | {mx:8.2f} -> {my:8.2f}")
    changed = []
    for name, ea in a.nodes.items():
        eb = b.nodes.get(name)
        if eb is None or (ea.outputs, ea.inputs) == (eb.outputs, eb.inputs):
            continue
        delta = eb.compute_us + eb.comm_us - ea.compute_us - ea.comm_us
        changed.append((abs(delta), name, ea, eb, delta))
    only = [n for n in b.nodes if n not in a.nodes] + [n for n in a.nodes if n not in b.nodes]
    out.append(
        f"{len(changed)} nodes changed layout"
        + (f" ({len(only)} nodes in only one " "plan)" if only else "")
        + (f"; the {limit} that moved the most cost:" if len(changed) > limit else ":")
    )
    for _, name, ea, eb, delta in sorted(changed, key=lambda c: (-c[0], c[1]))[:limit]:
        out.append(
            f"  {name} [{node_layer(name, b)}]: "
            f"{' '.join(fmt_layout(o) for o in ea.outputs)} -> "
            f"{' '.join(fmt_layout(o) for o in eb.outputs)}  "
            f"({delta / 1e3:+.3f} ms)"
        )
    return out
