"""torchrun worker: torchtitan 0.3's own language models (FlexAttention with a block mask passed
beside the tokens, as torchtitan's trainer calls them: causal, or its packed-document mask)
planned by AutoParallel and trained a few SGD steps on every rank (gloo), compared with the
single-process model.

On CPU both sides run FlexAttention's dense math (autoshard.dense_flex_attention_on_cpu for
the reference; the parallel program calls the same higher-order ops on local shards).

    python -m torch.distributed.run --nproc-per-node=4 torchtitan_worker.py CONFIG OUT
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

from scenario_runner import compare_losses, compare_parameters, run_scenarios

RTOL, ATOL = 1e-4, 1e-6
BATCH, SEQ, VOCAB = 4, 256, 2048
EOS = 0


class WithLoss(nn.Module):
    """torchtitan's model and its loss as one module: what the parallel step trains."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, positions, attention_masks, labels):
        logits = self.model(tokens, positions, attention_masks)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def model_config(family: str, layers: int = 2):
    """torchtitan's debug model of ``family`` with FlexAttention, cut to ``layers`` layers."""
    if family == "llama3":
        from torchtitan.models.llama3 import llama3_configs

        cfg = llama3_configs["debugmodel"]("flex")
    elif family == "qwen3":
        from torchtitan.models.qwen3 import qwen3_configs

        cfg = qwen3_configs["debugmodel"]("flex")
    else:
        raise ValueError(family)
    cfg.layers = cfg.layers[:layers]
    return cfg


def block_mask(mask: str, positions: torch.Tensor, model: nn.Module):
    """``causal``: create_block_mask of a causal mask_mod; ``document``: torchtitan's own
    causal packed-document mask, ``model.get_attention_masks(positions)`` as its trainer
    builds it (its mask_mod captures a per-token table of document ends); torchtitan
    compiles create_block_mask, run eagerly here (no inductor on CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common.attention import get_causal_mask_mod

    if mask == "causal":
        return create_block_mask(get_causal_mask_mod(), BATCH, None, SEQ, SEQ, device="cpu")
    if mask == "document":
        with torch.compiler.set_stance("force_eager"):
            return model.get_attention_masks(positions)
    raise ValueError(mask)


def packed_positions(g: torch.Generator) -> torch.Tensor:
    """Per-token positions of rows packed from documents of random lengths (torchtitan's
    dataset: each document ends with EOS and the next one starts at position 0)."""
    rows = []
    for _ in range(BATCH):
        row, left = [], SEQ
        while left:
            n = min(left, int(torch.randint(16, 160, (), generator=g)))
            row += range(n)
            left -= n
        rows.append(row)
    return torch.tensor(rows)


def make_inputs(sc: dict, seed: int, model: nn.Module):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = sc.get("mask", "causal")
    if mask == "document":
        positions = packed_positions(g)
        tokens[:, :-1][positions[:, 1:] == 0] = EOS  # each document but the last ends with EOS
    else:
        positions = torch.arange(SEQ).repeat(BATCH, 1)
    return tokens, positions, block_mask(mask, positions, model), labels


def input_constraints(inputs) -> list:
    """The batch of tokens and labels split over the first mesh dim; the rest free."""
    import torch.utils._pytree as pytree

    shard = (Shard(0), Replicate())
    cons = [None] * len(pytree.tree_leaves(inputs))
    cons[0] = cons[-1] = shard
    return cons


def run_scenario(sc: dict, rank: int) -> dict:
    from autoshard import AutoParallel, dense_flex_attention_on_cpu
    from autoshard.runtime.module_runtime import runtime_of
    from autoshard.runtime.module_state import load_full_state_dict, local_inputs

    mesh = init_device_mesh("cpu", tuple(sc["mesh"]), mesh_dim_names=("dp", "tp"))
    cfg = model_config(sc["model"])
    torch.manual_seed(1234)
    ref = WithLoss(cfg.build())
    ref.model.init_states()
    with torch.device("meta"):
        meta_model = WithLoss(cfg.build())
    inputs = [make_inputs(sc, 100 + i, ref.model) for i in range(sc.get("steps", 3))]
    with AutoParallel(
        meta_model, inputs[0], mesh, strict=True, time_limit_s=sc.get("time_limit_s", 30.0),
        runtime=sc.get("runtime", "program"),
    ) as autop:
        autop.add_input_constraints(input_constraints(inputs[0]))
        plan = autop.optimize_placement(verbose=False)
        parallel = autop.apply_placement(plan)
    parallel.to_empty(device="cpu")
    # parameters under every name (Qwen3 ties its embedding and output weights) and the
    # rotary cache, a buffer outside the state dict
    full = dict(ref.named_parameters(remove_duplicate=False))
    load_full_state_dict(parallel, {**full, **dict(ref.named_buffers())})
    opt = torch.optim.SGD(parallel.parameters(), lr=sc.get("lr", 0.1))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=sc.get("lr", 0.1))
    steps = []
    for x in inputs:
        a, k = local_inputs(parallel, *x)
        loss = parallel(*a, **k)
        loss.backward()
        opt.step()
        opt.zero_grad()
        with dense_flex_attention_on_cpu():
            ref_loss = ref(*x)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        steps.append({**compare_losses(loss, ref_loss, RTOL, ATOL),
                      **compare_parameters(parallel, ref, RTOL, ATOL)})
    flex_layouts = {name: entry for name, entry in plan.plan["nodes"].items()
                    if name.startswith("flex_attention")}
    return {"name": sc["name"], "ok": True, "steps": steps, "flex_layouts": flex_layouts,
            "warnings": dict(runtime_of(parallel).runner.warnings)}


def main() -> int:
    logging.getLogger("torch").setLevel(logging.ERROR)
    return run_scenarios(run_scenario)


if __name__ == "__main__":
    sys.exit(main())
