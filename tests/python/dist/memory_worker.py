"""torchrun worker: the planner's memory prediction (the plan's summary.memory) against what
the parallel module holds on each gloo rank over one training step (runtime/memory_probe.py:
torch's MemTracker for the peak, the program's own count for the saved bytes).

Each scenario plans a model with its inputs split on the batch dim under the default
parameter budget (and the scenario's ``limit``: memory_limit_bytes, which recomputation
may be chosen to meet), runs one step to warm up, then measures the next (gradients set to
None before it, as an optimizer's zero_grad does). With ``reference``, the step's loss and
gradients are compared with the single-process model's on the whole batch.

Usage: torchrun --standalone --nproc-per-node 4 memory_worker.py CONFIG.json OUT_DIR
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard

from scenario_runner import run_scenarios

from autoshard.api.autoparallel import AutoParallel
from autoshard.runtime.memory_probe import measure_step_memory
from autoshard.runtime.module_runtime import runtime_of
from autoshard._testing import hf_zoo
from autoshard._testing.models_zoo import GPT2LM, MoEBlock, llama3_memory


def _llama():
    return llama3_memory(), lambda: (torch.randint(0, 256, (8, 64)), torch.randint(0, 256, (8, 64)))


def _gpt2():
    model = GPT2LM(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, dropout=0.0)
    return model, lambda: (torch.randint(0, 128, (8, 64)), torch.randint(0, 128, (8, 64)))


def _moe():
    return MoEBlock(dim=64, hidden=96), lambda: (torch.randn(8, 32, 64), torch.randn(8, 32, 64))


def _vit():
    model, inputs = hf_zoo.build("vit", device="cpu")
    return model, inputs


MODELS = {"llama": _llama, "gpt2": _gpt2, "moe": _moe, "vit": _vit}


def _materialise(parallel: torch.nn.Module) -> None:
    parallel.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in parallel.parameters():
            p.normal_(0.0, 0.02)


def run(sc: dict, rank: int) -> dict:
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    with torch.device("meta"):
        model, input_fn = MODELS[sc["model"]]()
    with AutoParallel(model, input_fn, mesh, memory_limit_bytes=sc.get("limit"),
                      recompute=sc.get("recompute")) as autop:
        autop.add_input_constraints([(Shard(0),)] * len(input_fn()))
        parallel = autop.apply_placement(autop.optimize_placement())
    _materialise(parallel)
    torch.manual_seed(1)
    local = [t.chunk(world)[rank].contiguous() for t in input_fn()]

    losses = []

    def step():
        loss = parallel(*local)
        losses.append(loss.detach())
        loss.backward()

    step()
    for p in parallel.parameters():
        p.grad = None
    measured = measure_step_memory(parallel, step, tuple(local))
    plan = runtime_of(parallel).plan
    predicted = plan["summary"]["memory"]
    out = {"name": sc["name"], "ok": True,
           "measured": {"peak": measured.peak_bytes, "saved": measured.saved_bytes},
           "predicted": {"peak": predicted["step_peak_bytes"], "saved": predicted["saved_activations"],
                         "optimizer_state": predicted["optimizer_state"]},
           "recompute": plan["summary"]["recompute"], "recomputed_nodes": len(plan.get("recompute", []))}
    if sc.get("reference"):
        torch.manual_seed(1)
        out["errors"] = _errors_against_one_process(parallel, MODELS[sc["model"]], input_fn(), losses[-1])
    return out


def _errors_against_one_process(parallel, model_fn, inputs, loss) -> dict:
    """Largest |difference| / max(|reference|) of the loss and each gradient, against the
    model on one process with the parallel module's parameters, on the whole batch."""
    ref, _ = model_fn()
    ref.load_state_dict({n: p.full_tensor() for n, p in parallel.named_parameters()}, strict=False)
    ref_loss = ref(*inputs)
    ref_loss.backward()
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))  # noqa: E731
    errors = {"loss": rel(loss, ref_loss.detach())}
    grads = dict(ref.named_parameters())
    for name, p in parallel.named_parameters():
        errors[name] = rel(p.grad.full_tensor(), grads[name].grad)
    return errors


if __name__ == "__main__":
    raise SystemExit(run_scenarios(run))
