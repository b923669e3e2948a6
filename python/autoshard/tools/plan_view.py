"""`autoshard view PLAN.json [--graph GRAPH.json] [--out DIR]`: a plan as a picture.

Writes DIR/<plan>.png (matplotlib: the step's timeline of compute vs communication, and per
layer time and parameter memory per GPU) and DIR/<plan>.html, one self-contained page (the
PNG inlined as a data URI, no scripts, no outside links): the plan's totals and, per layer,
the layout of each weight and of the main forward activations.
"""

from __future__ import annotations

import argparse
import base64
import html
import os
import sys

from autoshard.planning.plan import Plan
from autoshard.planning.plan_layers import (
    Layer,
    backward_start_us,
    fmt_layout,
    layers,
    load_plan,
    timeline,
)

COLORS = {"compute": "#4c78a8", "comm": "#e45756"}


def render_png(plan: Plan, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = layers(plan)
    segs = timeline(plan)
    fig, (ax_t, ax_l) = plt.subplots(
        2,
        1,
        figsize=(12, 3 + 0.22 * len(rows)),
        gridspec_kw={"height_ratios": [1, max(2, len(rows) / 6)]},
    )
    # timeline: one lane per kind, time in ms
    for lane, kind in enumerate(("compute", "comm")):
        bars = [(s / 1e3, d / 1e3) for _, k, s, d, _ in segs if k == kind]
        ax_t.broken_barh(bars, (lane - 0.4, 0.8), facecolors=COLORS[kind], linewidth=0)
    bwd = backward_start_us(plan)
    if bwd is not None:
        ax_t.axvline(bwd / 1e3, color="black", linestyle="--", linewidth=1)
        ax_t.text(bwd / 1e3, 1.45, " backward", fontsize=8, va="top")
    ax_t.set_yticks([0, 1], ["compute", "communication"])
    ax_t.set_ylim(-0.6, 1.6)
    ax_t.set_xlabel("time in the step (ms, cost model: each node's redistribution then its op)")
    ax_t.set_title(_title(plan), fontsize=10)
    # per layer: compute and communication ms (bars), parameter MiB per GPU (labels)
    names = [r.name for r in rows]
    y = list(range(len(rows)))
    comp = [r.compute_us / 1e3 for r in rows]
    comm = [r.comm_us / 1e3 for r in rows]
    ax_l.barh(y, comp, color=COLORS["compute"], label="compute")
    ax_l.barh(y, comm, left=comp, color=COLORS["comm"], label="communication")
    for i, r in enumerate(rows):
        if r.param_bytes:
            ax_l.text(
                comp[i] + comm[i],
                i,
                f" {r.param_bytes / 2**20:.1f} MiB/GPU",
                va="center",
                fontsize=7,
            )
    ax_l.set_yticks(y, names, fontsize=7)
    ax_l.invert_yaxis()
    ax_l.set_xlabel("ms per step (labels: parameter memory per GPU)")
    ax_l.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _title(plan: Plan) -> str:
    s = plan.summary
    shape = "x".join(str(x) for x in plan.mesh_shape)
    names = "/".join(plan.mesh_dim_names or [])
    preset = f", preset {plan.preset}" if plan.preset else ""
    return (
        f"mesh {shape} {f'({names})' if names else ''} on {plan.hardware or '?'}"
        f"{preset}: step {s.total_us / 1e3:.2f} ms = compute "
        f"{s.compute_us / 1e3:.2f} + communication {s.comm_us / 1e3:.2f} ms"
    )


def _memory_rows(m) -> str:
    """The step's memory per GPU (plan summary.memory): the peak, then what it is made of;
    nothing for plans made before the planner predicted it."""
    if not m.peak_bytes:
        return ""
    parts = [
        ("parameters", m.parameters),
        ("gradients", m.gradients),
        ("optimizer state", m.optimizer_state),
        ("saved activations", m.saved_activations),
        ("buffers", m.buffers),
        ("inputs", m.inputs),
    ]
    where = f" (step peak at {html.escape(m.peak_at)})" if m.peak_at else ""
    rows = f"<tr><td>peak memory per GPU</td><td>{m.peak_bytes / 2**30:.3f} GiB{where}</td></tr>"
    return rows + "".join(
        f"<tr><td>&nbsp;&nbsp;{name}</td><td>{b / 2**30:.3f} GiB</td></tr>" for name, b in parts
    )


def _recompute_row(r) -> str:
    """What the backward recomputes (plan summary.recompute), when anything."""
    if not r.blocks:
        return ""
    levels = ", ".join(f"{b} {lvl}" for b, lvl in r.blocks.items())
    return (
        f"<tr><td>recompute</td><td>{html.escape(levels)}; "
        f"+{r.added_us / 1e3:.3f} ms a step</td></tr>"
    )


def render_html(plan: Plan, png: bytes, title: str) -> str:
    e = html.escape
    s = plan.summary
    rows = layers(plan)
    head = (
        f"<tr><td>estimated step</td><td>{s.total_us / 1e3:.3f} ms</td></tr>"
        f"<tr><td>compute / communication</td><td>{s.compute_us / 1e3:.3f}"
        f" ms / {s.comm_us / 1e3:.3f} ms</td></tr>"
        f"<tr><td>lower bound</td><td>{s.lower_bound_us / 1e3:.3f} ms"
        f"</td></tr><tr><td>parameters per GPU</td>"
        f"<td>{s.parameter_bytes_per_gpu / 2**20:.2f} MiB</td></tr>"
        + _memory_rows(s.memory)
        + _recompute_row(s.recompute)
    )
    body = "\n".join(_layer_row(r) for r in rows)
    note = (
        ""
        if plan.node_info
        else (
            "<p class=note>This plan carries no node_info: layers are unknown. Pass the traced "
            "graph with <code>--graph GRAPH.json</code> (or write the plan with "
            "<code>autoshard demo --plan-out</code>).</p>"
        )
    )
    before = f"""<p>{e(_title(plan))}</p>
<table class=summary>{head}</table>
{note}
<h2>Timeline and per-layer cost</h2>"""
    after = f"""<h2>Per layer</h2>
<table class=layers>
<tr><th>layer</th><th>compute ms</th><th>comm ms</th><th>params MiB/GPU</th>
<th>weights (layout per mesh dim)</th><th>main activations (inputs -&gt; output)</th></tr>
{body}
</table>"""
    alt = "timeline of compute vs communication and per-layer cost"
    return inline_png_page(title, before, png, alt, after)


def inline_png_page(title: str, before: str, png: bytes, alt: str, after: str) -> str:
    """One self-contained page (no scripts, no outside links): the title, the HTML
    ``before``, the PNG inlined as a data URI, then ``after``."""
    e = html.escape
    img = base64.b64encode(png).decode("ascii")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; text-align: left; }}
th {{ background: #eee; }} code {{ font-size: 12px; }} .note {{ color: #a33; }}
.num {{ text-align: right; white-space: nowrap; }}
</style></head><body>
<h1>{e(title)}</h1>
{before}
<img alt="{e(alt)}"
 src="data:image/png;base64,{img}">
{after}</body></html>
"""


def _layer_row(r: Layer) -> str:
    e = html.escape
    prefix = r.name + "."
    weights = "<br>".join(
        f"<code>{e(fqn[len(prefix):] if fqn.startswith(prefix) else fqn)} "
        f"{e(fmt_layout(l))}</code>"
        for fqn, l in r.weights
    )
    acts = "<br>".join(
        f"<code>{e(n if n.startswith(op) else f'{n} {op}')}: "
        f"{e(' '.join(fmt_layout(i) for i in ins))} -&gt; {e(fmt_layout(o))}</code>"
        for n, op, ins, o in r.activations
    )
    return (
        f'<tr data-layer="{e(r.name)}"><td>{e(r.name)}</td>'
        f"<td class=num>{r.compute_us / 1e3:.3f}</td><td class=num>{r.comm_us / 1e3:.3f}</td>"
        f"<td class=num>{r.param_bytes / 2**20:.2f}</td><td>{weights}</td><td>{acts}</td></tr>"
    )


def write_view(plan: Plan, out_dir: str, stem: str) -> tuple[str, str]:
    """Writes OUT_DIR/STEM.png and OUT_DIR/STEM.html; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    png_path = os.path.join(out_dir, stem + ".png")
    html_path = os.path.join(out_dir, stem + ".html")
    render_png(plan, png_path)
    with open(png_path, "rb") as f:
        page = render_html(plan, f.read(), f"autoshard plan {stem}")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(page)
    return html_path, png_path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="autoshard view", description=__doc__.splitlines()[0])
    p.add_argument("plan", help="plan JSON (autoshard plan --out, autoshard demo --plan-out)")
    p.add_argument(
        "--graph", help="the traced graph JSON, for layers when the plan has no " "node_info"
    )
    p.add_argument("--out", default=".", help="output directory (default: the current one)")
    args = p.parse_args(argv)
    try:
        plan = load_plan(args.plan, args.graph)
    except (OSError, ValueError) as e:
        print(f"autoshard view: {e}", file=sys.stderr)
        return 1
    stem = os.path.basename(args.plan).split(".")[0] or "plan"
    html_path, png_path = write_view(plan, args.out, stem)
    print(f"wrote {html_path} and {png_path}")
    return 0
