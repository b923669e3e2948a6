"""Runtime paths that Hugging Face families exercise, on small stand-ins (torchrun worker, gloo,
and imported by tests/python/test_runtime_hf.py for its one-rank tests):

- ``custom``: a custom op with its own autograd (a backward custom op), as transformers'
  ``grouped_mm_fallback`` is: DTensor has no rule, so it runs replicated; the plan asks for
  its weight gradient as P(sum) (a replicated result entering a sum-reduced layout).
- ``transformers``: transformers' ``grouped_mm_fallback`` with token counts from ``histc``,
  planned by the C++ planner (both run on local shards in the plan's layouts).
- ``conv``: a convolution whose output channels the plan splits (DTensor's rule splits the
  batch only), forward and backward.

Every scenario runs under both runtimes and compares the loss and every parameter gradient
with the eager model in one process (rtol 1e-5, atol 1e-6).

    python -m torch.distributed.run --nproc-per-node=N hf_runtime_worker.py CONFIG OUT
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- a custom op with autograd


@torch.library.custom_op("autoshard_test::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows ``[offs[i-1], offs[i])`` of ``x`` times ``w[i]``, written into a fresh output
    through ``out=`` views (as transformers' fallback does)."""
    out = x.new_zeros(x.shape[0], w.shape[2])
    start = 0
    for i, end in enumerate(offs.tolist()):
        if end > start:
            torch.mm(x[start:end], w[i], out=out[start:end])
        start = end
    return out


@grouped_mm.register_fake
def _(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[2])


@torch.library.custom_op("autoshard_test::grouped_mm_backward", mutates_args=())
def grouped_mm_backward(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor,
                        grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gx, gw = torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for i, end in enumerate(offs.tolist()):
        if end > start:
            torch.mm(grad[start:end], w[i].t(), out=gx[start:end])
            torch.mm(x[start:end].t(), grad[start:end], out=gw[i])
        start = end
    return gx, gw


@grouped_mm_backward.register_fake
def _(x, w, offs, grad):
    return torch.empty_like(x), torch.empty_like(w)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    gx, gw = grouped_mm_backward(x, w, ctx.offs, grad)
    return gx, gw, None


grouped_mm.register_autograd(_backward, setup_context=_setup)


class TinyMoE(nn.Module):
    """Tokens routed to ``experts`` expert matrices (top-1), sorted by expert, multiplied by a
    grouped matmul op, scattered back; ``op`` is the grouped matmul (x, w, offs) -> y."""

    def __init__(self, op=None, dim: int = 8, experts: int = 4):
        super().__init__()
        self.op = op
        self.experts = experts
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, 2 * dim) / dim ** 0.5)
        self.w2 = nn.Parameter(torch.randn(experts, 2 * dim, dim) / dim ** 0.5)

    def forward(self, x):
        op = self.op if self.op is not None else torch.ops.autoshard_test.grouped_mm
        h = x.flatten(0, -2)
        probs = self.router(h).softmax(-1)
        weight, expert = probs.max(-1)
        order = expert.argsort(stable=True)
        counts = torch.histc(expert.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = counts.cumsum(0).to(torch.int32)
        y = op(F.gelu(op(h[order], self.w1, offs)), self.w2, offs)
        out = y[order.argsort()] * weight.unsqueeze(-1)  # back in token order
        return (out + h).pow(2).mean()


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.conv(x)).mean((2, 3))).pow(2).mean()


# ---------------------------------------------------------------- scenarios

def _nodes(step, target: str):
    return [n for n in step.gm.graph.nodes if str(n.target) == target]


def _custom_plan(step, ndim: int) -> dict:
    """Batch-split inputs; the weight gradients of the custom backward op as P(sum)."""
    rep = ["R"] * ndim
    nodes = {name: {"outputs": [["S(0)"] + rep[1:]]} for name in step.input_nodes if name}
    for n in _nodes(step, "autoshard_test.grouped_mm_backward.default"):
        nodes[n.name] = {"outputs": [rep, ["P(sum)"] + rep[1:]]}
    return {"nodes": nodes}


def _conv_plan(step, ndim: int) -> dict:
    """The convolution's output channels split on mesh dim 0, forward and backward."""
    rep = ["R"] * ndim
    s0, s1 = ["S(0)"] + rep[1:], ["S(1)"] + rep[1:]
    (conv,) = _nodes(step, "aten.convolution.default")
    (bwd,) = _nodes(step, "aten.convolution_backward.default")
    return {"nodes": {
        conv.name: {"inputs": [rep, s0, s0], "outputs": [s1]},
        # (grad_output, input, weight) -> (grad_input: not asked for, grad_weight, grad_bias)
        bwd.name: {"inputs": [s1, rep, s0], "outputs": [None, s0, s0]},
    }}


class CacheCat(nn.Module):
    """Keys appended to a cache that starts as ``torch.tensor([])`` (transformers' DynamicLayer,
    as T5 runs it): ``torch.cat`` skips the 1-D empty tensor, DTensor's cat rule did not, so
    the step failed on 2 ranks with "Dimension out of range"."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.k = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        keys = self.k(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
        return torch.cat([torch.tensor([]), keys], dim=-2).pow(2).mean()


def build(name: str):
    """(model, example inputs, plan function or None: the C++ planner plans it)."""
    torch.manual_seed(0)
    if name == "custom":
        return TinyMoE(), (torch.randn(4, 6, 8),), _custom_plan
    if name == "transformers":
        import transformers.integrations.moe  # noqa: F401  registers the custom ops

        return (TinyMoE(torch.ops.transformers.grouped_mm_fallback), (torch.randn(4, 6, 8),),
                None)
    if name == "conv":
        return ConvNet(), (torch.randn(4, 3, 6, 6),), _conv_plan
    if name == "cache_cat":
        return CacheCat(), (torch.randn(4, 6, 8),), None
    raise ValueError(name)


def run_scenario(name: str, runtime: str, mesh) -> dict:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from autoshard import AutoParallel
    from autoshard.runtime.module_state import load_full_state_dict, local_inputs
    from autoshard.runtime.module_runtime import runtime_of
    from autoshard.runtime.parallel_module import build_parallel_module
    from autoshard.trace.tracer import trace_training_step

    ref, inputs, plan_fn = build(name)
    with torch.device("meta"):
        meta = build(name)[0]
    if plan_fn is None:
        batch = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)
        with AutoParallel(meta, lambda: inputs, mesh, runtime=runtime, strict=True,
                          time_limit_s=5.0, plan_cache=False) as autop:
            autop.add_input_constraints([batch] * len(inputs))
            par = autop.apply_placement(autop.optimize_placement())
    else:
        step = trace_training_step(meta, lambda: inputs, capture="direct")
        strict = name != "custom"  # the replicated custom op's results are redistributed
        par = build_parallel_module(meta, step, plan_fn(step, mesh.ndim), mesh,
                                    runtime=runtime, strict=strict)
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref.state_dict())
    args, kwargs = local_inputs(par, *inputs)
    loss = par(*args, **kwargs)
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    loss.backward()
    rloss = ref(*inputs)
    rloss.backward()
    worst = {}
    ref_grads = dict(ref.named_parameters())
    for n, p in par.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        r = ref_grads[n].grad
        ok = g is not None and torch.allclose(g, r, rtol=1e-5, atol=1e-6)
        worst[n] = None if g is None else float((g - r).abs().max())
        if not ok:
            raise AssertionError(f"{name}/{runtime}: gradient of {n} differs from eager: "
                                 f"max abs diff {worst[n]}")
    if not torch.allclose(loss, rloss, rtol=1e-5, atol=1e-6):
        raise AssertionError(f"{name}/{runtime}: loss {float(loss)} != eager {float(rloss)}")
    runner = runtime_of(par).runner
    return {"loss": float(loss.detach()), "ref_loss": float(rloss.detach()), "grad_diff": worst,
            "warnings": dict(runner.warnings)}


def main() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    cfg_path, out_dir = sys.argv[1], Path(sys.argv[2])
    config = json.loads(Path(cfg_path).read_text())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = []
    for sc in config:
        mesh = init_device_mesh("cpu", tuple(sc["mesh"]))
        res = {"name": sc["name"], "ok": True}
        try:
            res.update(run_scenario(sc["scenario"], sc["runtime"], mesh))
        except Exception as e:  # reported per scenario
            res.update(ok=False, error=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc())
        results.append(res)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
