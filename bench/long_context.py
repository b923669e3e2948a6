#!/usr/bin/env python3
"""Context parallelism planned by autoshard against torch's own context-parallel API, side by
side in one run: the same Llama-style model (causal SDPA), one long sequence split over
every rank (cp = the world), the same gloo ranks.

- autoshard: the model planned by AutoParallel with its tokens and labels ``Shard(1)`` over
  ``cp``, attention in its sequence row (q sharded, k / v gathered) and the residual stream
  sequence-sharded; run as the lowered per-rank program. ``recompute="reshard"`` (--recompute)
  as FSDP2 reshards after the forward on the torch side: gathered weights, and the keys and
  values gathered to the whole sequence, are gathered again in the backward, not kept.
- torch_cp: what a torchtitan user writes: FSDP2 (``fully_shard`` per layer and on the
  model) over the cp ranks and ``torch.distributed.tensor.experimental.context_parallel``
  around each step, with the tokens, labels and rotary tables as its buffers (its default
  head-tail load balance for causal attention; the loss is each rank's mean over its
  tokens, averaged by FSDP's gradient reduction, torchtitan's recipe).

torch 2.13 ships ring kernels for the CUDA attention ops only: on a CPU mesh its
``context_parallel`` stops at "aten._scaled_dot_product_flash_attention_for_cpu.default
does not have a sharding strategy registered". This bench routes that CPU kernel (forward and
backward) through torch's own ring functions (``_templated_ring_attention`` and its
backward, the algorithm torch runs for CUDA flash attention), so the torch side runs torch's
ring attention, not a home-made one; on a GPU it would need no help.

Each variant's step is timed on every rank (the slowest rank counts), mean of --steps steps,
best of interleaved rounds; peak memory over one step by torch's MemTracker (rank 0); the
first step's losses are compared so both compute the same thing.

    python3 bench/long_context.py                        # seq 4096 on 4 ranks
    python3 bench/long_context.py --seq 1024 --ranks 2 --dim 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("autoshard", "torch_cp")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--recompute",
        default="reshard",
        help="autoshard's recompute mode (default reshard: gathered weights and activations "
        "gathered again in the backward, as FSDP2's default reshard_after_forward does)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.seq % (2 * a.ranks):
        p.error(f"--seq {a.seq} must split into 2 x {a.ranks} chunks (the head-tail split)")
    return a


def config(a):
    from autoshard.models import LlamaConfig

    return LlamaConfig(
        dim=a.dim,
        n_layers=a.layers,
        n_heads=a.heads,
        n_kv_heads=a.kv_heads,
        vocab_size=a.vocab,
        ffn_dim=4 * a.dim,
        max_seq_len=a.seq,
        attention="sdpa",
    )


def data(a) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randint(0, a.vocab, (1, a.seq), generator=g) for _ in range(2))


# ---- autoshard ---------------------------------------------------------------------------
def _pin_sequence_split(autop, cfg, seq: int) -> None:
    """Attention in its sequence row and the residual stream ([1, seq, dim]: the embedding
    and the residual adds) sequence-sharded, so the whole block follows the split."""
    from torch.distributed.tensor import Shard

    for n in autop.gm.graph.nodes:
        val = n.meta.get("val")
        if "scaled_dot_product" in str(n.target):
            autop.add_node_constraint(n.name, (Shard(2),))
        elif str(n.target) in ("aten.embedding.default", "aten.add.Tensor") and tuple(
            getattr(val, "shape", ())
        ) == (1, seq, cfg.dim):
            autop.add_node_constraint(n.name, (Shard(1),))


def autoshard_variant(a, mesh, state: dict):
    from torch.distributed.tensor import Shard

    from autoshard import AutoParallel
    from autoshard.models import Llama
    from autoshard.runtime.module_state import load_full_state_dict

    cfg = config(a)
    with torch.device("meta"):
        meta = Llama(cfg)
    with AutoParallel(
        meta,
        lambda: tuple(torch.zeros(1, a.seq, dtype=torch.long) for _ in range(2)),
        mesh,
        time_limit_s=30.0,
        plan_cache=False,
        optimizer="sgd",
        recompute=a.recompute,
    ) as autop:
        autop.add_input_constraints([(Shard(1),), (Shard(1),)])
        _pin_sequence_split(autop, cfg, a.seq)
        parallel = autop.apply_placement(autop.optimize_placement())
    parallel.to_empty(device="cpu")
    load_full_state_dict(parallel, state)
    rank, n = mesh.get_local_rank(), mesh.size()

    def loss_of(tokens, labels):  # the global sequence's mean loss, on every rank
        shard = slice(rank * a.seq // n, (rank + 1) * a.seq // n)
        return parallel(tokens[:, shard], labels[:, shard])

    return parallel, loss_of


# ---- torch's context parallelism -------------------------------------------------------------
def _install_cpu_ring_attention() -> None:
    """Route the CPU flash-attention kernel through torch's ring attention functions (see
    the module docstring): DTensor's handler table gets the two ops torch's own table
    lacks; each call unwraps q / k / v (``Shard(2)`` on the cp mesh), runs torch's ring
    forward or backward on the local blocks and wraps the results as ``Shard(2)``."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def fwd_kernel(query, key, value, is_causal, dropout_p=0.0, scale=None):
        return fwd(query, key, value, dropout_p, is_causal, scale=scale)

    def bwd_kernel(query, key, value, out, logsumexp, is_causal, grad_out, dropout_p, scale):
        return bwd(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, scale=scale)

    def sharded(local: torch.Tensor, mesh) -> DTensor:
        shape = list(local.shape)
        shape[2] *= mesh.size()
        stride = torch.empty(shape, device="meta").stride()
        meta = TensorMeta(torch.Size(shape), stride, local.dtype)
        return DTensor(local, DTensorSpec(mesh, (Shard(2),), meta), requires_grad=False)

    def forward(op, args, kwargs):
        q, k, v, dropout_p, is_causal = (list(args) + [0.0, False])[:5]
        mesh = q.device_mesh
        out, lse = ring._templated_ring_attention(
            mesh.get_group(), 2, fwd_kernel, q.to_local(), k.to_local(), v.to_local(),
            is_causal=is_causal, dropout_p=dropout_p, scale=kwargs.get("scale"),
        )  # fmt: skip
        return sharded(out, mesh), sharded(lse, mesh)

    def backward(op, args, kwargs):
        grad_out, q, k, v, out, lse, dropout_p, is_causal = args[:8]
        mesh = q.device_mesh
        grads = ring._templated_ring_attention_backward(
            mesh.get_group(), 2, bwd_kernel, grad_out=grad_out.to_local(),
            grad_out_name="grad_out", query=q.to_local(), key=k.to_local(),
            value=v.to_local(), out=out.to_local(), logsumexp=lse.to_local(),
            is_causal=is_causal, dropout_p=dropout_p, scale=kwargs.get("scale"),
        )  # fmt: skip
        return tuple(sharded(g, mesh) for g in grads)

    DTensor._op_dispatcher._custom_op_handlers.update({fwd: forward, bwd: backward})


def _llama_with_tables(cfg):
    """``Llama`` whose forward takes the rotary tables (context_parallel shards them as
    buffers; the model's own forward builds them from the local length) and returns the
    mean over this rank's tokens."""
    from autoshard.models import Llama

    class LlamaWithTables(Llama):
        def forward(self, tokens, labels, cos, sin):
            h = self.tok_embeddings(tokens)
            for layer in self.layers:
                h = layer(h, cos, sin)
            logits = self.output(self.norm(h))
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    return LlamaWithTables(cfg)


def torch_cp_variant(a, mesh, state: dict):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.experimental import context_parallel

    from autoshard.models import rope_tables

    _install_cpu_ring_attention()
    cfg = config(a)
    model = _llama_with_tables(cfg)
    model.load_state_dict(state)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    cos, sin = rope_tables(cfg.dim // cfg.n_heads, a.seq, cfg.rope_theta)

    def loss_of(tokens, labels):
        buffers = [tokens.clone(), labels.clone(), cos.clone(), sin.clone()]
        with context_parallel(
            mesh, buffers=buffers, buffer_seq_dims=[1, 1, 0, 0], no_restore_buffers=set(buffers)
        ):
            return model(*buffers)

    return model, loss_of


# ---- one rank ------------------------------------------------------------------------------
def _make_step(model, loss_of, tokens, labels):
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def step():
        loss = loss_of(tokens, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step.read = lambda loss: float(loss.detach())
    return step


def _mean_over_ranks(value: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([value])
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def worker(a) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.models import Llama
    from step_time import _peak_memory, _time_steps

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (a.ranks,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    state = Llama(config(a)).state_dict()
    tokens, labels = data(a)
    out, steps = {}, {}
    for name, build in (("autoshard", autoshard_variant), ("torch_cp", torch_cp_variant)):
        t0 = time.perf_counter()
        model, loss_of = build(a, mesh, {k: v.clone() for k, v in state.items()})
        steps[name] = _make_step(model, loss_of, tokens, labels)
        out[name] = {"build_s": time.perf_counter() - t0, "rounds_s": []}
        # autoshard's loss is the global mean on every rank; torch_cp's the rank's own mean
        out[name]["first_loss"] = _mean_over_ranks(float(steps[name]().detach()))
        for _ in range(a.warmup - 1):
            steps[name]()
        out[name]["memory"] = _peak_memory(steps[name], model, name)
    for _ in range(a.rounds):
        for name, step in steps.items():
            out[name]["rounds_s"].append(_time_steps(a, step))
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


# ---- launcher ------------------------------------------------------------------------------
def launch(a) -> None:
    from torchrun_launch import run_workers

    res = run_workers(__file__, a.ranks, a)
    print(
        f"model: Llama-style, dim {a.dim}, {a.layers} layers, {a.heads} heads "
        f"({a.kv_heads} KV), causal SDPA, vocab {a.vocab}; one sequence of {a.seq} tokens "
        f"split over cp={a.ranks} gloo ranks, one thread each; mean of {a.steps} steps "
        f"after {a.warmup}, best of {a.rounds} rounds; autoshard recompute={a.recompute}\n"
    )
    print("| variant | step (s) | peak MiB (rank 0) | build (s) | first step's loss |")
    print("|---|---:|---:|---:|---|")
    best, peak = {}, {}
    for name in VARIANTS:
        r = res[name]
        best[name], peak[name] = min(r["rounds_s"]), r["memory"]["peak_bytes"] / 2**20
        print(
            f"| {name} | {best[name]:.4f} | {peak[name]:.1f} | {r['build_s']:.1f} "
            f"| {r['first_loss']:.6f} |"
        )
    print(
        f"\nautoshard / torch_cp: step {best['autoshard'] / best['torch_cp']:.3f}x, "
        f"peak memory {peak['autoshard'] / peak['torch_cp']:.3f}x"
    )


def main(argv=None) -> int:
    a = parse(argv)
    if a.worker:
        worker(a)
    else:
        launch(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
