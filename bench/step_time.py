"""Step time of autoshard's parallel module vs FSDP2 and DDP written by hand, side by side.

The model is a Llama-style decoder written here (pre-norm RMSNorm, grouped-query attention
with F.scaled_dot_product_attention, SwiGLU MLP, untied output head), not autoshard's test
model. Every variant trains the same model on the same GLOBAL batch (split over the ranks on
the batch dim) with SGD, one thread per rank, gloo on CPU; a step is forward + backward +
optimizer step + zero_grad. Reported: the mean step time over ``--steps`` steps (the slowest
rank's) after ``--warmup`` steps, and the ratio to FSDP2 / DDP. Every variant is built
first, then timed in ``--rounds`` interleaved rounds (each round times every variant once)
and the best round counts: on a shared, noisy machine a load spike then slows one round,
not one variant.

Variants:
  autoshard          default parameter budget (1/n of the parameters per rank: FSDP-like)
  autoshard_ddp      low = high = 1 (replicated parameters: DDP-like)
  autoshard_compile  the default-budget plan with compile=True (inductor, CPU)
  autoshard_ddp_compile  the DDP-like plan with compile=True
  autoshard_interp   the reference DTensor interpreter (runtime="interpret"), for comparison
  fsdp2              torch.distributed.fsdp.fully_shard on every block, then the root
  fsdp2_ac           fsdp2 with every block checkpointed (torch.utils.checkpoint: full
                     activation checkpointing, the block recomputed in the backward)
  fsdp2_sac          fsdp2 with selective checkpointing of every block: matmul and attention
                     outputs saved, the rest recomputed (torchtitan's "op" policy, by hand)
  ddp                torch.nn.parallel.DistributedDataParallel
  ddp_global_loss    DDP that also returns the global batch's mean loss, as autoshard (and the
                     model on one device) does: an async all-reduce of the detached local
                     mean issued after the forward and waited for when the loss is read
                     (here: at the next step's start), as a DDP user logging the loss writes it

    python3 bench/step_time.py                        # dim 128, 2 layers; 2 and 4 ranks
    python3 bench/step_time.py --dim 256 --layers 4
    python3 bench/step_time.py --ranks 2 --variants autoshard,fsdp2
    python3 bench/step_time.py --ranks 2 --profile /tmp/traces   # + Chrome traces, overlap
    python3 bench/step_time.py --memory     # + each variant's measured peak (MemTracker)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ALL_VARIANTS = [
    "autoshard",
    "autoshard_ddp",
    "autoshard_compile",
    "autoshard_ddp_compile",
    "autoshard_interp",
    "fsdp2",
    "fsdp2_ac",
    "fsdp2_sac",
    "ddp",
    "ddp_global_loss",
]


# ---- the model ---------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.attn_norm = RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        rep = self.heads // self.kv_heads
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))


def make_model(a) -> Decoder:
    return Decoder(a.vocab, a.dim, a.layers, a.heads, a.kv_heads, a.hidden)


class Checkpointed(nn.Module):
    """A block run under torch.utils.checkpoint: ``policy`` None recomputes all of it in the
    backward; otherwise the ops it names are saved and the rest recomputed (selective)."""

    def __init__(self, block: nn.Module, policy=None):
        super().__init__()
        self.block, self.policy = block, policy

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        if self.policy is None:
            return checkpoint(self.block, x, use_reentrant=False)
        context = lambda: create_selective_checkpoint_contexts(self.policy)  # noqa: E731
        return checkpoint(self.block, x, use_reentrant=False, context_fn=context)


# what fsdp2_sac saves: matmul and attention outputs (the policy runs for every op)
_SAC_SAVED = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
}


def _save_matmuls_and_attention(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAC_SAVED else CheckpointPolicy.PREFER_RECOMPUTE


# ---- one rank --------------------------------------------------------------------------------
def _autoshard_module(a, mesh, variant, ref_state):
    from torch.distributed.tensor import Shard

    from autoshard import AutoParallel
    from autoshard.runtime.module_state import load_full_state_dict

    with torch.device("meta"):
        meta = make_model(a)
    shapes = [(a.batch, a.seq)] * 2
    t0 = time.perf_counter()
    with AutoParallel(
        meta,
        lambda: tuple(torch.empty(s, dtype=torch.long) for s in shapes),
        mesh,
        compile=variant.endswith("_compile"),
        hardware=a.hardware,
        runtime="interpret" if variant == "autoshard_interp" else "program",
        time_limit_s=a.plan_time_limit,
        plan_cache=False,
        memory_limit_bytes=int(a.memory_limit_mib * 2**20) if a.memory_limit_mib else None,
        optimizer="sgd",  # the step's optimizer (no state)
    ) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        if variant.startswith("autoshard_ddp"):
            autop.add_parameter_memory_constraint(1.0, 1.0)
        else:
            autop.add_parameter_memory_constraint()
        plan = autop.optimize_placement()
        par = autop.apply_placement(plan)
    plan_s = time.perf_counter() - t0
    par.to_empty(device="cpu")
    load_full_state_dict(par, ref_state)
    return par, plan_s


def _build_variant(a, variant: str, rank: int, world: int) -> tuple:
    """The variant's model, one-step function and info (plan time, first step)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    ref = make_model(a)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    per = a.batch // world
    local = (tokens[rank * per : (rank + 1) * per], targets[rank * per : (rank + 1) * per])
    mesh = init_device_mesh("cpu", (world,))
    info: dict = {}
    if variant.startswith("autoshard"):
        model, info["plan_s"] = _autoshard_module(a, mesh, variant, ref.state_dict())
    elif variant.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        model = ref
        if variant != "fsdp2":  # checkpoint each block first, then shard it (torchtitan's order)
            policy = _save_matmuls_and_attention if variant == "fsdp2_sac" else None
            model.blocks = nn.ModuleList(Checkpointed(b, policy) for b in model.blocks)
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif variant in ("ddp", "ddp_global_loss"):
        model = nn.parallel.DistributedDataParallel(ref)
    else:
        raise ValueError(f"unknown variant {variant!r}; choose from {ALL_VARIANTS}")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    pending = []  # ddp_global_loss: the last step's loss all-reduce, not yet waited for

    def step():
        while pending:
            pending.pop().wait()
        loss = model(*local)
        if variant == "ddp_global_loss":
            mean = loss.detach() / world
            pending.append(dist.all_reduce(mean, async_op=True))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return mean if variant == "ddp_global_loss" else loss

    def read(loss) -> float:  # the loss's value, as a user reading it gets it
        while pending:
            pending.pop().wait()
        return float(loss.detach())

    step.read = read

    t0 = time.perf_counter()
    first = step().detach()
    info["first_step_s"] = time.perf_counter() - t0
    if variant == "ddp_global_loss":
        first = torch.tensor(read(first))
    elif not variant.startswith("autoshard"):
        # DDP's and FSDP2's loss is the rank's own batch mean; autoshard's is the global
        # batch's (as on one device). Every rank has as many targets, so the mean of the
        # ranks' means is the global one: the first losses of all variants must agree.
        first = first.clone()
        dist.all_reduce(first)
        first /= world
    info["first_loss"] = float(first)
    for _ in range(a.warmup - 1):
        step()
    return model, step, info


def _time_steps(a, step) -> float:
    """Mean seconds per step of the slowest rank over ``a.steps`` steps."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    step.read(loss)
    elapsed = torch.tensor([(time.perf_counter() - t0) / a.steps])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _profile(a, step, variant: str, rank: int, world: int) -> dict:
    """Profile a few steps; rank 0 writes the Chrome trace and returns how much of the
    communication ran behind compute (trace_overlap.py), per step."""
    from torch.profiler import profile

    from trace_overlap import overlap_summary

    with profile() as prof:
        for _ in range(a.profile_steps):
            step()
    if rank != 0:
        return {}
    os.makedirs(a.profile, exist_ok=True)
    path = os.path.join(a.profile, f"{variant}_{world}ranks.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        s = overlap_summary(json.load(f))
    return {
        "trace": path,
        "comm_ms": s["comm_ms"] / a.profile_steps,
        "hidden_ms": s["hidden_ms"] / a.profile_steps,
    }


def _peak_memory(step, model, variant: str) -> dict:
    """One step (forward, backward, optimizer step) under torch's MemTracker: the most
    bytes live at once on this rank, the model's own included; for autoshard also the
    planner's prediction (the plan's summary.memory)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        step()
    peak = max(v.get("Total", 0) for v in tracker.get_tracker_snapshot("peak").values())
    out = {"peak_bytes": int(peak)}
    if variant.startswith("autoshard"):
        from autoshard.runtime.module_runtime import runtime_of

        from autoshard.planning.plan import RecomputeSummary

        summary = runtime_of(model).plan["summary"]
        out["predicted_bytes"] = summary["memory"]["step_peak_bytes"]
        out["recompute"] = RecomputeSummary.from_json(summary.get("recompute") or {}).describe()
    return out


def worker(a) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out, steps, models = {}, {}, {}
    for v in a.variants.split(","):
        try:
            models[v], steps[v], out[v] = _build_variant(a, v, rank, world)
        except Exception as e:  # one failing variant must not hide the others
            out[v] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        dist.barrier()
    for _ in range(a.rounds):
        for v, step in steps.items():
            t = _time_steps(a, step)
            out[v]["step_s"] = min(t, out[v].get("step_s", float("inf")))
            out[v].setdefault("rounds_s", []).append(t)
    if a.profile:
        for v, step in steps.items():
            out[v].update(_profile(a, step, v, rank, world))
    if a.memory:
        for v, step in steps.items():
            out[v].update(_peak_memory(step, models[v], v))
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


# ---- launcher --------------------------------------------------------------------------------
def _global_batch(batch: int, ranks: list[int], parser) -> int:
    """Every variant splits the global batch evenly over the ranks (DDP and FSDP2 take each
    rank's slice), so it must divide by every world size timed; ``batch`` 0 picks the least
    multiple of all of them that is at least 8. Uneven parameter shards (dim 128 on 3
    ranks) are what --ranks 3 measures; an uneven batch would change the model's loss."""
    lcm = math.lcm(*ranks)
    if batch == 0:
        return lcm * -(-8 // lcm)
    bad = [n for n in ranks if batch % n]
    if bad:
        parser.error(
            f"--batch {batch} does not divide into {bad} ranks: give a multiple of "
            f"{lcm} (or leave --batch out)"
        )
    return batch


def _fmt(r: dict, key: str = "step_s") -> str:
    return f"{r[key]:.4f} s" if key in r else "failed"


def launch(a) -> None:
    rows = []
    for n in [int(x) for x in a.ranks.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out.json")
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={n}",
                __file__,
                "--worker",
                "--out",
                out,
            ]
            cmd += [
                f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}")
                for k, v in vars(a).items()
                if k not in ("worker", "out", "ranks") and v is not None and v is not False
            ]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-6000:], file=sys.stderr)
                raise SystemExit(f"{n} ranks: torchrun failed ({proc.returncode})")
            rows.append((n, json.load(open(out))))
    print(
        f"model: dim {a.dim}, {a.layers} layers, {a.heads} heads ({a.kv_heads} kv), hidden "
        f"{a.hidden}, vocab {a.vocab}; global batch {a.batch} x seq {a.seq}; SGD; gloo, one "
        f"thread per rank; mean of {a.steps} steps after {a.warmup}, best of {a.rounds} "
        f"interleaved rounds\n"
    )
    variants = a.variants.split(",")
    print(
        "| ranks | "
        + " | ".join(variants)
        + " | autoshard / fsdp2 | autoshard_ddp / ddp | autoshard_ddp / ddp_global_loss "
        "| compile / fsdp2 | ddp_compile / ddp | best compiled / min(fsdp2, ddp) |"
    )
    print("|---:|" + "---:|" * (len(variants) + 6))
    for n, res in rows:

        def ratio(x, y):
            if x in res and y in res and "step_s" in res[x] and "step_s" in res[y]:
                return f"{res[x]['step_s'] / res[y]['step_s']:.2f}"
            return "-"

        best = min(
            (res[v]["step_s"] for v in ("fsdp2", "ddp") if "step_s" in res.get(v, {})), default=None
        )
        compiled = min(
            (
                res[v]["step_s"]
                for v in ("autoshard_compile", "autoshard_ddp_compile")
                if "step_s" in res.get(v, {})
            ),
            default=None,
        )
        comp = f"{compiled / best:.2f}" if best and compiled else "-"
        print(
            f"| {n} | "
            + " | ".join(_fmt(res[v]) for v in variants)
            + f" | {ratio('autoshard', 'fsdp2')} | {ratio('autoshard_ddp', 'ddp')} | "
            f"{ratio('autoshard_ddp', 'ddp_global_loss')} | "
            f"{ratio('autoshard_compile', 'fsdp2')} | {ratio('autoshard_ddp_compile', 'ddp')} "
            f"| {comp} |"
        )
    if a.profile:
        print(
            "\ncommunication per step under the profiler (rank 0; gloo threads busy, and "
            "the part of it hidden behind compute):\n"
        )
        print("| ranks | " + " | ".join(variants) + " |")
        print("|---:|" + "---:|" * len(variants))
        for n, res in rows:
            print(
                f"| {n} | "
                + " | ".join(
                    (
                        f"{res[v]['comm_ms']:.1f} ms, {res[v]['hidden_ms']:.1f} hidden"
                        if "comm_ms" in res[v]
                        else "-"
                    )
                    for v in variants
                )
                + " |"
            )
    if a.memory:
        _print_memory(rows, variants)
    print()
    for n, res in rows:
        for v in variants:
            r = res[v]
            extra = ", ".join(f"{k} {r[k]:.2f} s" for k in ("plan_s", "first_step_s") if k in r)
            if "rounds_s" in r:
                extra += ", rounds " + " ".join(f"{t:.4f}" for t in r["rounds_s"]) + " s"
            if "trace" in r:
                extra += f", trace {r['trace']}"
            print(
                f"{n} ranks {v}: {r.get('error') or extra}; first loss "
                f"{r.get('first_loss', float('nan')):.5f}"
            )


def _print_memory(rows, variants) -> None:
    print(
        "\npeak memory per rank over one step (MemTracker, rank 0; model, gradients and "
        "activations), and autoshard's step time and peak against each checkpointed FSDP2:\n"
    )
    print("| ranks | " + " | ".join(variants) + " | autoshard predicted |")
    print("|---:|" + "---:|" * (len(variants) + 1))
    for n, res in rows:
        cells = [
            f"{res[v]['peak_bytes'] / 2**20:.2f} MiB" if "peak_bytes" in res[v] else "-"
            for v in variants
        ]
        pred = res.get("autoshard", {}).get("predicted_bytes")
        pred_cell = f"{pred / 2**20:.2f} MiB" if pred else "-"
        print(f"| {n} | " + " | ".join(cells) + f" | {pred_cell} |")
    for n, res in rows:
        if "recompute" in res.get("autoshard", {}):
            print(f"{n} ranks autoshard's plan: {res['autoshard']['recompute']}")
    for n, res in rows:
        a = res.get("autoshard", {})
        for base in ("fsdp2", "fsdp2_ac", "fsdp2_sac"):
            b = res.get(base, {})
            if "step_s" in a and "step_s" in b and "peak_bytes" in a and "peak_bytes" in b:
                print(
                    f"{n} ranks autoshard / {base}: step {a['step_s'] / b['step_s']:.2f}x, "
                    f"peak {a['peak_bytes'] / b['peak_bytes']:.2f}x"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=0, help="MLP hidden size (default 4 x dim)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument(
        "--batch",
        type=int,
        default=0,
        help="global batch, a multiple of every --ranks value (default: the least such "
        "multiple >= 8: 8 for 2,4; 9 for 3; 12 for 2,3,4)",
    )
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved timing rounds over all variants; the best one counts",
    )
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--variants", default=",".join(ALL_VARIANTS))
    p.add_argument("--plan-time-limit", type=float, default=10.0)
    p.add_argument(
        "--hardware",
        default=None,
        help="autoshard's cost-model profile (default: 'CPU' on gloo; 'measure' "
        "measures the ranks first)",
    )
    p.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="also profile each variant (torch.profiler) and write Chrome traces "
        "to DIR, with how much communication ran behind compute",
    )
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument(
        "--memory-limit-mib",
        type=float,
        default=0,
        help="autoshard plans to this peak per rank (memory_limit_bytes), recomputing "
        "what it must; 0: no limit",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="also measure each variant's peak memory over one step (MemTracker)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.hidden = a.hidden or 4 * a.dim
    if a.worker:  # the launcher passes the global batch it chose
        worker(a)
    else:
        a.batch = _global_batch(a.batch, [int(x) for x in a.ranks.split(",")], p)
        launch(a)


if __name__ == "__main__":
    main()
