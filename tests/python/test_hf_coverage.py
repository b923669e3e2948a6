"""Common Hugging Face model families plan out of the box (issue 14), and messages about ops
without a rule point at the user's model.

Every family of python/autoshard/testing/hf_zoo.py (Llama, Qwen2/3, Mistral, Mixtral in float32 and
bfloat16, Gemma2/3, Phi3, GPT-2, BERT, T5, ViT, CLIP, a DeepSeek-V3-style MoE, and a head
with the common torch losses) is built with a tiny config on the meta device, traced and
planned on a virtual 8x8 mesh (fake process group) with a short solver time limit, as
tools/hf_coverage.py does.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoshard import _core
from autoshard._testing import hf_zoo
from autoshard.user_frames import Frame, frame_rank, parse_stack_trace, user_frame
from tiny_graphs import tiny_graph

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the extension was built without the planner"
)


@pytest.mark.parametrize("name", list(hf_zoo.FAMILIES))
def test_family_plans_on_a_virtual_8x8_mesh(name):
    result = hf_zoo.check_family(name, (8, 8), time_limit_s=1.0)
    print(
        f"{name}: {result.nodes} nodes, trace {result.trace_s:.1f} s, plan "
        f"{result.plan_s:.1f} s: {result.status()}"
    )
    assert result.ok, f"{name}: {result.status()}"


# ----------------------------------------------------------------------------- source lines


def test_hugging_face_nodes_name_the_modeling_file():
    """Ops dispatched inside transformers' helpers (MoE experts in integrations/moe.py, the
    loss in loss/loss_utils.py, torch.nn.functional.pad) are attributed to the line of
    modeling_mixtral.py that called the helper."""
    from autoshard.trace.tracer import trace_training_step
    from autoshard._testing.capture import export_graph

    model, input_fn = hf_zoo.build("mixtral")
    graph = export_graph(trace_training_step(model, input_fn))
    sources = {n["op"]: n.get("source", "") for n in graph["nodes"] if n["op"] != "placeholder"}
    for op in [
        "aten.histc.default",
        "transformers.grouped_mm_fallback.default",
        "aten.constant_pad_nd.default",
        "aten.nll_loss_forward.default",
    ]:
        assert sources[op].startswith("modeling_mixtral.py:"), (op, sources[op])
    files = {n.get("source", "").split(":")[0] for n in graph["nodes"] if n["op"] != "placeholder"}
    assert files == {"modeling_mixtral.py"}, files


class ReflectPad(nn.Module):
    """An op without a rule reached through torch.nn.functional (whose frame is innermost)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return F.pad(self.proj(x), (2, 2), mode="reflect").sum()


def test_missing_rule_message_names_the_model_line_and_the_options():
    from autoshard import AutoParallel
    from autoshard.trace.fake_pg import fake_world

    with torch.device("meta"):
        model = ReflectPad()
    with fake_world((2, 2), device_type="cpu") as mesh:
        with AutoParallel(model, lambda: torch.empty(4, 3, 8), mesh, time_limit_s=1.0) as autop:
            with pytest.raises(ValueError) as info:
                autop.optimize_placement()
    msg = str(info.value)
    print(msg)
    assert "reflection_pad1d" in msg
    here = os.path.basename(__file__)
    assert f"{here}:" in msg and 'F.pad(self.proj(x), (2, 2), mode="reflect")' in msg
    assert "functional.py" not in msg and "functional_export.py" not in msg
    assert "open an issue" in msg and "docs/rules.md" in msg
    assert "cpp/src" not in msg  # not something a user can do


def test_user_frame_ranks_model_helpers_and_torch():
    torch_file = os.path.join(os.path.dirname(torch.__file__), "nn", "functional.py")
    export = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "functional_export.py")
    hf = "/env/site-packages/transformers/"
    frames = [
        Frame(export, 232, "forward", "res = self._export_root(*args)"),
        Frame("/home/me/train.py", 10, "forward", "return self.model(**batch).loss"),
        Frame(hf + "models/mixtral/modeling_mixtral.py", 127, "forward", "self.experts(h)"),
        Frame(hf + "integrations/moe.py", 449, "grouped_mm_experts_forward", "histc(ids)"),
        Frame(torch_file, 5823, "pad", "return torch._C._nn.pad(...)"),
    ]
    assert [frame_rank(f.filename) for f in frames] == [2, 0, 0, 1, 2]
    assert user_frame(frames).lineno == 127  # the innermost model frame
    assert user_frame(frames[:2]).filename == "/home/me/train.py"
    assert user_frame([frames[0], frames[3], frames[4]]).lineno == 449  # a helper beats torch
    assert user_frame([frames[0], frames[4]]) is None  # never a torch frame
    trace = (
        '  File "/home/me/model.py", line 9, in forward\n'
        "    return F.mse_loss(y, t)\n"
        "           ^^^^^^^^^^^^^^^^\n"
        '  File "<stdin>", line 3, in f\n'
    )
    assert parse_stack_trace(trace) == [
        Frame("/home/me/model.py", 9, "forward", "return F.mse_loss(y, t)"),
        Frame("<stdin>", 3, "f", ""),
    ]


def test_coverage_script_lists_missing_ops(capsys):
    """tools/hf_coverage.py prints one line per family (trace only here: the planning is
    covered above)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "hf_coverage.py"
    spec = importlib.util.spec_from_file_location("hf_coverage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--families", "losses,vit", "--trace-only"]) == 0
    out = capsys.readouterr().out
    assert "losses" in out and "vit" in out and out.count(" OK") == 2, out


def test_missing_ops_are_listed_not_raised():
    assert hf_zoo.missing_ops(tiny_graph("aten.frobnicate.default")) == ["aten.frobnicate.default"]
