"""torchrun worker: plan (or take a hand-made plan), train a few SGD steps on every rank with
the gloo backend, and compare loss and parameters with a single-process reference model.

Usage: torchrun --standalone --nproc-per-node 4 train_worker.py CONFIG.json OUT_DIR
CONFIG is a list of scenarios; each rank writes OUT_DIR/rank<r>.json with one result per
scenario (errors included, so the pytest side can report them).
"""

from __future__ import annotations

import logging
import sys
import time

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

from scenario_runner import (compare_losses, compare_parameters, reference_step,
                             run_scenarios)

from autoshard.runtime.module_state import load_full_state_dict, local_inputs

from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.models import MLP, Llama, LlamaConfig, TinyGPT
from autoshard.trace.tracer import trace_training_step
from autoshard.runtime.module_runtime import runtime_of

RTOL, ATOL = 1e-5, 1e-6
_TRACED: dict = {}


def make_model(kind: str, device: str = "cpu"):
    if kind == "mlp":
        return MLP(dim=16, hidden=32, layers=2)
    if kind in ("llama", "llama_deep"):  # deep: its trace is extrapolated (block_extrapolation.py)
        return Llama(LlamaConfig(dim=32, n_layers=6 if kind == "llama_deep" else 2, n_heads=4,
                                 n_kv_heads=2, vocab_size=64, ffn_dim=64, max_seq_len=8))
    if kind == "classifier":
        return Classifier()
    if kind.startswith("gpt:"):  # gpt:DIM:HEADS:VOCAB:BATCH, sizes that need not divide
        dim, heads, vocab = (int(v) for v in kind.split(":")[1:4])
        return TinyGPT(dim=dim, n_heads=heads, vocab_size=vocab)
    if kind.startswith("llama:"):  # llama:DIM:HEADS:VOCAB:BATCH (KV heads = heads)
        dim, heads, vocab = (int(v) for v in kind.split(":")[1:4])
        return Llama(LlamaConfig(dim=dim, n_layers=2, n_heads=heads, n_kv_heads=heads,
                                 vocab_size=vocab, ffn_dim=2 * dim, max_seq_len=8,
                                 attention="sdpa"))
    raise ValueError(kind)


class Classifier(nn.Module):
    """A linear classifier under mean cross-entropy with many classes: enough compute that
    the planner keeps the batch sharded, so the loss divides by an all-reduced count of
    targets, and the program divides the gradients by it at the end of the backward
    (late_loss_scale.py)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 4096)

    def forward(self, x, target):
        return nn.functional.cross_entropy(self.head(x), target)


def make_inputs(kind: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return (torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g))
    if kind == "classifier":
        target = torch.randint(0, 4096, (256,), generator=g)
        target[seed % 256] = -100  # ignored: the ranks count different numbers of targets
        return (torch.randn(256, 64, generator=g), target)
    vocab, batch = (int(v) for v in kind.split(":")[3:5]) if ":" in kind else (64, 4)
    return tuple(torch.randint(0, vocab, (batch, 8), generator=g) for _ in range(2))


def hand_plan(step, kind: str, style: str, mesh_ndim: int) -> dict:
    """Partial plans written by hand: placeholder layouts only; DTensor fills in the rest."""
    nodes = {}
    R = ["R"] * mesh_ndim

    def lay(**by_dim):
        out = list(R)
        for d, s in by_dim.items():
            out[int(d[1:])] = s
        return out

    for name in step.input_nodes:
        if name and style != "replicate":
            nodes[name] = {"outputs": [lay(m0="S(0)")]}
    for ph, fqn in step.param_fqns.items():
        if style == "fsdp" and step.placeholder(ph).meta["val"].shape[0] % 4 == 0:
            nodes[ph] = {"outputs": [lay(m0="S(0)")]}
        elif style == "tp":
            # column-parallel in-projections, row-parallel out-projections on mesh dim 1
            if any(k in fqn for k in ("wq.", "wk.", "wv.", "w1.", "w3.")):
                nodes[ph] = {"outputs": [lay(m1="S(0)")]}
            elif any(k in fqn for k in ("wo.", "w2.")):
                nodes[ph] = {"outputs": [lay(m1="S(1)")]}
    return {"version": 1, "nodes": nodes}


def param_fraction(module) -> float:
    held = total = 0
    seen = set()
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
        held += p.to_local().numel() * p.element_size()
    return held / total


def layouts_by_fqn(module) -> dict:
    from autoshard.placements import layout_to_strs

    return {n: layout_to_strs(p.placements) for n, p in module.named_parameters()}


def run_scenario(sc: dict, rank: int) -> dict:
    kind = sc["model"]
    mesh_shape = tuple(sc["mesh"])
    names = tuple(sc.get("dim_names") or [f"d{i}" for i in range(len(mesh_shape))])
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    torch.manual_seed(1234)
    ref = make_model(kind)
    with torch.device("meta"):
        meta_model = make_model(kind)
    inputs = [make_inputs(kind, 100 + i) for i in range(sc.get("steps", 3))]
    result: dict = {"name": sc["name"], "ok": False}
    t0 = time.perf_counter()
    if sc["plan"] == "auto":
        from autoshard.api.autoparallel import AutoParallel

        def input_fn():
            return tuple(torch.empty(x.shape, dtype=x.dtype) for x in inputs[0])

        with AutoParallel(meta_model, input_fn, mesh, strict=sc.get("strict", True),
                          memory_limit_bytes=sc.get("memory_limit_bytes"),
                          capture=sc.get("capture", "direct"),
                          time_limit_s=sc.get("time_limit_s", 8.0),
                          hardware=sc.get("hardware", "H100"),
                          runtime=sc.get("runtime", "program"),
                          compile=sc.get("compile", False),
                          repeated_layers=sc.get("repeated_layers")) as autop:
            if sc.get("input_shard", True):
                lay = (Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1)
                autop.add_input_constraints([lay] * len(inputs[0]))
            pm = sc.get("param_memory", "default")
            if pm == "default":
                autop.add_parameter_memory_constraint()
            elif pm is None:
                autop.remove_parameter_memory_constraint()
            else:
                autop.add_parameter_memory_constraint(*pm)
            plan = autop.optimize_placement(verbose=False)
            parallel = autop.apply_placement(plan)
            step = autop.step
        result["report"] = plan.get("report", "")
        result["summary"] = plan.get("summary", {})
    elif sc["plan"] == "auto_parallel":
        from torch.distributed.tensor import distribute_tensor

        from autoshard import auto_parallel

        lay = (Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1)
        samples = tuple(distribute_tensor(x, mesh, lay) for x in inputs[0])
        budget = sc.get("param_memory")
        parallel = auto_parallel(meta_model, mesh, samples,
                                 out_shardings=(Replicate(),) * len(mesh_shape),
                                 parameter_memory_budget=tuple(budget) if budget else None,
                                 strict=True, time_limit_s=sc.get("time_limit_s", 8.0))
        step = runtime_of(parallel).runner.step
        result["report"] = runtime_of(parallel).plan.get("report", "")
    else:
        key = (kind, tuple(tuple(x.shape) for x in inputs[0]))
        if key not in _TRACED:  # tracing is deterministic: one trace per model and shapes
            _TRACED[key] = trace_training_step(meta_model, lambda: tuple(
                torch.empty(x.shape, dtype=x.dtype) for x in inputs[0]),
                capture=sc.get("capture", "direct"))
        step = _TRACED[key]
        plan = hand_plan(step, kind, sc["plan"], len(mesh_shape))
        parallel = build_parallel_module(meta_model, step, plan, mesh, strict=False)
        if sc.get("record_strict"):
            # one lenient step records the complete plan; the strict module must follow it
            parallel.to_empty(device="cpu")
            load_full_state_dict(parallel, ref.state_dict())
            a, k = local_inputs(parallel, *inputs[0])
            parallel(*a, **k).backward()
            plan = runtime_of(parallel).runner.recorded_plan()
            parallel = build_parallel_module(meta_model, step, plan, mesh, strict=True)
    result["plan_seconds"] = time.perf_counter() - t0
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, ref.state_dict())
    result["isinstance"] = isinstance(parallel, type(ref))
    result["state_dict_keys_match"] = list(parallel.state_dict()) == list(ref.state_dict())
    result["param_fraction"] = param_fraction(parallel)
    result["layouts"] = layouts_by_fqn(parallel)
    opt = torch.optim.SGD(parallel.parameters(), lr=sc.get("lr", 0.1))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=sc.get("lr", 0.1))
    steps = []
    for x in inputs:
        a, k = local_inputs(parallel, *x)
        loss = parallel(*a, **k)
        loss.backward()
        grad_types = sorted({type(p.grad).__name__ for p in parallel.parameters()})
        grad_layouts_ok = all(p.grad is None or tuple(p.grad.placements) == tuple(p.placements)
                              for p in parallel.parameters())
        opt.step()
        opt.zero_grad()
        ref_loss = reference_step(ref, ref_opt, x)
        steps.append({**compare_losses(loss, ref_loss, RTOL, ATOL),
                      "grad_types": grad_types, "grad_layouts_ok": grad_layouts_ok,
                      **compare_parameters(parallel, ref, RTOL, ATOL)})
    result["steps"] = steps
    result["extrapolated"] = step.joint_with_descriptors is None
    program = runtime_of(parallel).program
    result["program_info"] = {k: v for k, v in (program.info if program else {}).items()
                              if isinstance(v, int)}
    result["warnings"] = dict(runtime_of(parallel).runner.warnings)
    result["ok"] = True
    return result


def main() -> int:
    logging.getLogger("torch").setLevel(logging.ERROR)
    return run_scenarios(run_scenario)


if __name__ == "__main__":
    sys.exit(main())
