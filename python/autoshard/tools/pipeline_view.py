"""A priced pipeline as a picture: the schedule's timeline (one lane per pipeline rank, each
microbatch's forward and backward of each stage as a box) and a page with the stages, the
bubble and each rank's memory. The input is what ``_core.price_pipeline`` returns and the
stage costs it was given (docs/pipeline.md, "Pricing a pipeline"); bench/pipeline_plans.py
writes one per priced choice with ``--view DIR``.
"""

from __future__ import annotations

import html
import os

from autoshard.tools.plan_view import inline_png_page

# forward boxes blue, backward orange; alternate shades tell neighbouring microbatches apart
SHADES = {"F": ("#4c78a8", "#72a0cf"), "B": ("#f58518", "#f8ad62")}
GiB = 2**30


def render_timeline_png(estimate: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    ranks = len(estimate["timeline"])
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.35 * ranks))
    for rank, actions in enumerate(estimate["timeline"]):
        for kind in ("F", "B"):
            for shade in (0, 1):
                boxes = [
                    (start / 1e3, (end - start) / 1e3)
                    for k, _stage, mb, start, end in actions
                    if k == kind and mb % 2 == shade
                ]
                ax.broken_barh(
                    boxes, (rank - 0.4, 0.8), facecolors=SHADES[kind][shade], linewidth=0
                )
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms): forward blue, backward orange, per microbatch")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summary_rows(estimate: dict) -> str:
    peaks = ", ".join(f"{b / GiB:.1f}" for b in estimate["rank_peak_bytes"])
    in_flight = ", ".join(str(n) for n in estimate["rank_peak_in_flight"])
    rows = [
        ("schedule", f"{estimate['schedule']}, {estimate['virtual_stages']} stage(s) per rank"),
        ("ranks x microbatches", f"{estimate['ranks']} x {estimate['microbatches']}"),
        ("step", f"{estimate['step_us'] / 1e3:,.1f} ms"),
        ("bubble", f"{100 * estimate['bubble_fraction']:.1f} %"),
        ("peak memory per rank (GiB)", peaks),
        ("microbatches in flight at the peak, per rank", in_flight),
    ]
    return "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)


def _stage_rows(estimate: dict, stages: list[dict]) -> str:
    out = []
    for s, c in enumerate(stages):
        out.append(
            f"<tr><td>{s}</td><td>{s % estimate['ranks']}</td>"
            f"<td class=num>{c['forward_us'] / 1e3:,.2f}</td>"
            f"<td class=num>{c['backward_us'] / 1e3:,.2f}</td>"
            f"<td class=num>{c.get('saved_bytes', 0) / GiB:.2f}</td>"
            f"<td class=num>{c.get('resident_bytes', 0) / GiB:.2f}</td>"
            f"<td class=num>{c.get('send_bytes', 0) / 2**20:.1f}</td></tr>"
        )
    return "\n".join(out)


def write_pipeline_view(
    estimate: dict, stages: list[dict], out_dir: str, stem: str, title: str
) -> tuple[str, str]:
    """Writes OUT_DIR/STEM.png (the timeline) and OUT_DIR/STEM.html (the page); returns
    their paths."""
    os.makedirs(out_dir, exist_ok=True)
    png_path = os.path.join(out_dir, stem + ".png")
    html_path = os.path.join(out_dir, stem + ".html")
    render_timeline_png(estimate, png_path, title)
    before = f"""<table class=summary>{_summary_rows(estimate)}</table>
<h2>Timeline</h2>"""
    after = f"""<h2>Stages (per microbatch)</h2>
<table class=layers>
<tr><th>stage</th><th>rank</th><th>forward ms</th><th>backward ms</th>
<th>saved GiB</th><th>resident GiB</th><th>send MiB</th></tr>
{_stage_rows(estimate, stages)}
</table>"""
    with open(png_path, "rb") as f:
        page = inline_png_page(title, before, f.read(), "the pipeline schedule's timeline", after)
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(page)
    return html_path, png_path
