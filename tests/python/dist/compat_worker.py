"""torchrun worker for the AutoParallel drop-in behaviours on 4 gloo ranks (see
tests/python/test_autoparallel_compat_dist.py): complex rotary embeddings with a
non-contiguous flatten after attention, free (unconstrained) outputs returned as DTensors,
init_weights written for full tensors, a DCP checkpoint saved under one plan and loaded
under another, and BatchNorm training with an input written in place.

Usage: torchrun --standalone --nproc-per-node 4 compat_worker.py CONFIG.json OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from autoshard import AutoParallel, local_inputs
from autoshard import models

DIM, HEADS, SEQ, VOCAB = 32, 4, 8, 64


def rope_table(head_dim: int, seq: int) -> torch.Tensor:
    freqs = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # complex64 [seq, head_dim/2]


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Complex rotary embeddings as Llama-3's reference code writes them."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * table.view(1, x.shape[1], 1, xc.shape[-1])).flatten(3)
    return out.type_as(x)


class RopeBlock(nn.Module):
    """Attention with complex rotary embeddings and `.flatten(-2)` after attention (its
    input is a transposed, non-contiguous tensor), an LM head; returns the logits."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("freqs_cis", rope_table(DIM // HEADS, SEQ))

    def forward(self, tokens):
        x = self.emb(tokens)
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, HEADS, -1)
        k = self.wk(x).view(b, s, HEADS, -1)
        v = self.wv(x).view(b, s, HEADS, -1)
        q, k = rotate(q, self.freqs_cis), rotate(k, self.freqs_cis)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        h = x + self.wo(o.transpose(1, 2).flatten(-2))
        return self.head(h)

    def init_weights(self):
        # single-device init code: assignment of new tensors, copy_ and .data[:] of full ones
        g = torch.Generator().manual_seed(7)
        self.freqs_cis = rope_table(DIM // HEADS, SEQ)
        self.emb.weight = nn.Parameter(torch.randn(VOCAB, DIM, generator=g))
        with torch.no_grad():
            self.wq.weight.copy_(torch.randn(DIM, DIM, generator=g) * 0.2)
            self.wk.weight.data[:] = torch.randn(DIM, DIM, generator=g) * 0.2
            self.wv.weight.data = torch.randn(DIM, DIM, generator=g) * 0.2
        nn.init.constant_(self.wo.weight, 0.01)
        self.head.weight.data.copy_(torch.randn(VOCAB, DIM, generator=g) * 0.1)


class LossBlock(RopeBlock):
    def forward(self, tokens, labels):
        logits = super().forward(tokens)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class Head(nn.Module):
    """A projection to a wide output: gathering [1024, 8192] logits costs more than keeping
    them sharded, so a free output stays sharded."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(256, 256)
        self.head = nn.Linear(256, 8192, bias=False)

    def forward(self, x):
        return self.head(torch.relu(self.a(x)))

    def init_weights(self):
        g = torch.Generator().manual_seed(3)
        for name, p in self.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (4, SEQ), generator=g),
            torch.randint(0, VOCAB, (4, SEQ), generator=g))


def plan(cls, mesh, example, *, in_layout, budget=None, out=None, dynamic=False):
    with torch.device("meta"):
        meta = cls()
    shapes = [(tuple(t.shape), t.dtype) for t in example]
    with AutoParallel(meta, lambda: tuple(torch.empty(s, dtype=d) for s, d in shapes), mesh,
                      capture="direct", time_limit_s=8.0, hardware="H100",
                      strict=True, dynamic=dynamic) as autop:
        autop.add_input_constraints([in_layout] * len(example))
        if budget is not None:
            autop.add_parameter_memory_constraint(*budget)
        if out is not None:
            autop.add_output_constraints(out)
        result = autop.optimize_placement()
        parallel = autop.apply_placement(result)
    return parallel, result


def reference(cls):
    ref = cls()
    ref.init_weights()
    return ref


def train_both(par, opt, ref, ref_opt, full_args) -> list[float]:
    """One optimizer step of the parallel module on this rank's shards of ``full_args`` and
    of the reference on the full values: [loss, reference loss]."""
    a, k = local_inputs(par, *full_args)
    loss = par(*a, **k)
    loss.backward()
    opt.step(), opt.zero_grad()
    ref_loss = ref(*full_args)
    ref_loss.backward()
    ref_opt.step(), ref_opt.zero_grad()
    return [float(loss), float(ref_loss)]


def close(a, b, tol=1e-5) -> bool:
    return torch.allclose(a, b, rtol=tol, atol=tol)


def rope_training(mesh4) -> dict:
    """LossBlock on (dp, tp): rope + flatten(-2) planned and trained like the reference."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    example = batch(0)
    par, _ = plan(LossBlock, mesh, example, in_layout=(Shard(0), Replicate()))
    par.to_empty(device="cpu")
    par.init_weights()
    ref = reference(LossBlock)
    init_ok = all(close(p.full_tensor(), ref.get_parameter(n)) for n, p in par.named_parameters())
    init_ok = init_ok and close(par.freqs_cis.full_tensor(), ref.freqs_cis)
    opt, ref_opt = torch.optim.SGD(par.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = [train_both(par, opt, ref, ref_opt, batch(10 + step)) for step in range(2)]
    params_ok = all(close(p.full_tensor(), ref.get_parameter(n), 1e-4)
                    for n, p in par.named_parameters())
    return {"init_ok": bool(init_ok), "losses": losses, "params_ok": bool(params_ok)}


def free_output(mesh4) -> dict:
    """Head returns wide logits with no output constraint: the plan keeps them sharded and
    the module returns a DTensor; values and gradients through it match the reference."""
    x = torch.randn(1024, 256, generator=torch.Generator().manual_seed(5))
    par, result = plan(Head, mesh4, (x,), in_layout=(Shard(0),), budget=(0.0, 1.0))
    par.to_empty(device="cpu")
    with torch.no_grad():
        par.init_weights()
    ref = Head()
    with torch.no_grad():
        ref.init_weights()
    (a, k) = local_inputs(par, x)
    out = par(*a, **k)
    ref_out = ref(x)
    res = {"is_dtensor": isinstance(out, DTensor),
           "placements": [str(p) for p in out.placements] if isinstance(out, DTensor) else None,
           "planned": result["graph_outputs"][0]}
    full = out.full_tensor() if isinstance(out, DTensor) else out
    res["values_ok"] = bool(close(full, ref_out.detach(), 1e-4))
    full.pow(2).mean().backward()
    ref_out.pow(2).mean().backward()
    res["grads_ok"] = all(close(p.grad.full_tensor(), ref.get_parameter(n).grad, 1e-4)
                          for n, p in par.named_parameters())
    return res


def dcp_reshard(mesh4, ckpt_dir: str) -> dict:
    """Train one step under an FSDP-like plan, save model + Adam state with DCP, load it
    into a (dp, tp) plan: the next step's loss equals the FSDP-like module's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    example = batch(0)
    fsdp, _ = plan(LossBlock, mesh4, example, in_layout=(Shard(0),))
    fsdp.to_empty(device="cpu")
    fsdp.init_weights()
    opt = torch.optim.Adam(fsdp.parameters(), lr=0.01)

    def step(module, optim, seed):
        a, k = local_inputs(module, *batch(seed))
        loss = module(*a, **k)
        loss.backward()
        optim.step()
        optim.zero_grad()
        return float(loss)

    step(fsdp, opt, 20)
    msd, osd = get_state_dict(fsdp, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt_dir)
    layouts_a = {n: [str(p) for p in t.placements] for n, t in fsdp.named_parameters()}

    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, _ = plan(LossBlock, mesh2, example, in_layout=(Shard(0), Replicate()), budget=(0.0, 0.5))
    tp.to_empty(device="cpu")
    tp_opt = torch.optim.Adam(tp.parameters(), lr=0.01)
    step(tp, tp_opt, 20)  # creates the optimizer state that the checkpoint overwrites
    msd2, osd2 = get_state_dict(tp, tp_opt)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(tp, tp_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    layouts_b = {n: [str(p) for p in t.placements] for n, t in tp.named_parameters()}
    weights_ok = all(close(p.full_tensor(), tp.get_parameter(n).full_tensor())
                     for n, p in fsdp.named_parameters())
    loss_a, loss_b = step(fsdp, opt, 21), step(tp, tp_opt, 21)
    loss_a2, loss_b2 = step(fsdp, opt, 22), step(tp, tp_opt, 22)
    return {"weights_ok": bool(weights_ok), "losses": [[loss_a, loss_b], [loss_a2, loss_b2]],
            "layouts_differ": layouts_a != layouts_b, "layouts_a": layouts_a,
            "layouts_b": layouts_b}


class ConvBn(models.ConvBn):
    """Scales its input in place first (written back to each rank's shard)."""

    def forward(self, x, target):
        x.mul_(0.5)
        return super().forward(x, target)


def batch_norm_training(mesh4) -> dict:
    """ConvBn on 4 ranks, batch sharded: synchronised batch statistics, so losses,
    parameters, running statistics and the written input equal the single-process model's."""
    g = torch.Generator().manual_seed(7)
    x, target = torch.randn(8, 3, 6, 6, generator=g), torch.randn(8, 4, generator=g)
    par, _ = plan(ConvBn, mesh4, (x, target), in_layout=(Shard(0),))
    par.to_empty(device="cpu")
    ref = ConvBn()
    par.load_state_dict(ref.state_dict())
    opt, ref_opt = torch.optim.SGD(par.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    losses, inputs_ok = [], True
    for step in range(2):
        xs = x + step
        a, k = local_inputs(par, xs.clone(), target)
        loss = par(*a, **k)
        loss.backward()
        opt.step(), opt.zero_grad()
        ref_x = xs.clone()
        ref_loss = ref(ref_x, target)
        ref_loss.backward()
        ref_opt.step(), ref_opt.zero_grad()
        losses.append([float(loss), float(ref_loss)])
        mine = ref_x.chunk(4)[dist.get_rank()]  # this rank's rows, after the write
        inputs_ok = inputs_ok and close(a[0], mine)
    state = dict(ref.named_parameters()) | dict(ref.named_buffers())
    state_ok = all(close(t.full_tensor().float(), state[n].float(), 1e-4)
                   for n, t in list(par.named_parameters()) + list(par.named_buffers()))
    return {"losses": losses, "state_ok": bool(state_ok), "inputs_ok": bool(inputs_ok)}


class Narrow(nn.Module):
    """Widths 4 ranks shard unevenly: 10 (3, 3, 3, 1) and 6 (2, 2, 2, 0)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(10, 6)
        self.down = nn.Linear(6, 10)

    def forward(self, x, target):
        return F.mse_loss(self.down(F.gelu(self.up(x))), target)


def uneven_dynamic(mesh4) -> dict:
    """dynamic=True with FSDP-like parameter shards of uneven widths (traced with size
    symbols, as AutoParallel's): trains like the single-process model, and a later batch of
    another size too."""
    g = torch.Generator().manual_seed(5)
    par, _ = plan(Narrow, mesh4, (torch.randn(8, 10), torch.randn(8, 10)),
                  in_layout=(Shard(0),), budget=(0.0, 0.25), dynamic=True)
    par.to_empty(device="cpu")
    ref = Narrow()
    par.load_state_dict(ref.state_dict())
    uneven = [n for n, p in par.named_parameters()
              if any(isinstance(pl, Shard) and p.shape[pl.dim] % 4 for pl in p.placements)]
    opt, ref_opt = torch.optim.SGD(par.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = [train_both(par, opt, ref, ref_opt,  # 12: a batch size not planned for
                         (torch.randn(rows, 10, generator=g), torch.randn(rows, 10, generator=g)))
              for rows in (8, 12)]
    state = dict(ref.named_parameters())
    params_ok = all(close(t.full_tensor(), state[n], 1e-4) for n, t in par.named_parameters())
    return {"losses": losses, "params_ok": bool(params_ok), "uneven": uneven}


SCENARIOS = {"rope_training": rope_training, "free_output": free_output,
             "dcp_reshard": dcp_reshard, "batch_norm_training": batch_norm_training,
             "uneven_dynamic": uneven_dynamic}


def main() -> None:
    cfg_path, out_dir = sys.argv[1], sys.argv[2]
    config = json.loads(open(cfg_path).read())
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh4 = init_device_mesh("cpu", (4,))
    results = []
    for sc in config:
        torch.manual_seed(0)
        try:
            args = [os.path.join(out_dir, "ckpt")] if sc["name"] == "dcp_reshard" else []
            res = SCENARIOS[sc["name"]](mesh4, *args)
            res.update(name=sc["name"], ok=True)
        except Exception as e:
            res = {"name": sc["name"], "ok": False, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()}
        results.append(res)
        dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
