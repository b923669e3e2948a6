"""torchrun worker: ranks that disagree, or one that never arrives, must stop every rank with
an error naming what differs (or who is missing) before any plan runs.

Usage: torchrun --standalone --nproc-per-node 4 rank_check_worker.py CONFIG.json OUT_DIR
CONFIG is a list of scenarios ({"name", "kind", "odd_rank", "timeout_s"}); kind is one of
"same" (control: every rank agrees), "eval" (agreeing ranks; the planned module, loaded with
torch's load_state_dict, is called in eval mode, under no_grad and with keywords in another
order, and compared with the single-process model), "hidden" / "layers" (the odd rank builds another
model), "random_same_seed" / "random_other_seeds" (a replicated dropout step, ranks seeded
alike or apart), "constraint" (the odd rank adds another parameter budget), "stall" (the odd rank
arrives after the timeout; must be last: a failed barrier leaves the group unusable).
Each rank writes OUT_DIR/rank<r>.json after every scenario, then exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

from autoshard import AutoParallel
from autoshard.runtime.module_state import local_inputs
from autoshard.models import MLP


class DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.drop = torch.nn.Dropout(0.5)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x, target):
        return ((self.down(self.drop(torch.relu(self.up(x)))) - target) ** 2).mean()


def check_eval(parallel) -> dict:
    """The planned module in eval mode equals the single-process eval model exactly enough,
    whatever the spelling of the call; back in train mode it trains (dropout on)."""
    torch.manual_seed(0)
    ref = DropoutMLP().eval()
    parallel.to_empty(device="cpu")
    parallel.load_state_dict(ref.state_dict())  # full tensors, sliced per rank
    g = torch.Generator().manual_seed(7)
    x, t = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    want = ref(x, t).item()
    (lx, lt), _ = local_inputs(parallel, x, t)
    parallel.eval()
    with torch.no_grad():
        quiet = parallel(target=lt, x=lx).item()
    loud = parallel(lx, target=lt)
    loud.backward()
    parallel.train()
    train = parallel(lx, lt)
    close = lambda a: abs(a - want) <= 1e-5 * max(1.0, abs(want))
    return {"eval_no_grad_close": close(quiet), "eval_grad_close": close(loud.item()),
            "train_has_graph": train.grad_fn is not None, "want": want, "got": quiet}


def check_random_states(parallel, rank: int, same_seed: bool) -> dict:
    """Dropout whose output is replicated over the mesh: ranks seeded alike run (and compute
    the same loss); ranks seeded apart are stopped before the step runs."""
    torch.manual_seed(0)
    parallel.to_empty(device="cpu")
    parallel.load_state_dict(DropoutMLP().state_dict())
    g = torch.Generator().manual_seed(7)
    x, t = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    torch.manual_seed(123 if same_seed else 123 + rank)
    try:
        loss = parallel(x, t)
    except RuntimeError as e:
        return {"random_error": str(e)}
    losses = [None] * dist.get_world_size()
    dist.all_gather_object(losses, float(loss))
    return {"random_losses": losses}


def run_scenario(sc: dict, rank: int, mesh) -> dict:
    odd = rank == sc.get("odd_rank", 3)
    hidden = 48 if sc["kind"] == "hidden" and odd else 32
    layers = 3 if sc["kind"] == "layers" and odd else 2
    random = sc["kind"].startswith("random")
    with torch.device("meta"):
        model = DropoutMLP() if sc["kind"] == "eval" or random else MLP(16, hidden, layers)
    inputs = lambda: (torch.empty(8, 16), torch.empty(8, 16))
    with AutoParallel(model, inputs, mesh, time_limit_s=2.0, capture="direct",
                      hardware="CPU", rank_timeout_s=sc["timeout_s"]) as autop:
        if random:  # every rank computes the whole (replicated) step
            autop.add_input_constraints([(Replicate(),), (Replicate(),)])
            autop.add_parameter_memory_constraint(1.0, 1.0)
        else:
            autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        if sc["kind"] == "constraint" and odd:
            autop.add_parameter_memory_constraint(1.0, 1.0)
        if sc["kind"] == "stall" and odd:
            time.sleep(sc["timeout_s"] + 3.0)
        t0 = time.perf_counter()
        try:
            plan = autop.optimize_placement()
        except Exception as e:
            return {"name": sc["name"], "ok": False, "type": type(e).__name__,
                    "error": str(e), "seconds": time.perf_counter() - t0}
        parallel = autop.apply_placement(plan)
    result = {"name": sc["name"], "ok": True, "seconds": time.perf_counter() - t0}
    if sc["kind"] == "eval":
        result.update(check_eval(parallel))
    if random:
        result.update(check_random_states(parallel, rank, sc["kind"] == "random_same_seed"))
    return result


def main() -> int:
    config_path, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with open(config_path) as f:
        scenarios = json.load(f)
    results = []
    for sc in scenarios:
        results.append(run_scenario(sc, rank, mesh))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f, indent=1)
    sys.stdout.flush()
    # after a failed barrier the group cannot be torn down cleanly: leave without it
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
