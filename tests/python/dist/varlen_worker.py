"""torchrun worker: variable-length attention. A Llama-style model with varlen attention
(``torch.nn.attention.varlen``: the batch packed into one token dim, causal attention within
each document, documents delimited by int32 offsets) planned with its attention calls pinned
to their head row on ``tp`` and their token row (a block of whole batch rows, with the offsets
of its documents) on ``dp``, trained 3 SGD steps on every rank (gloo, the CPU kernels of
ops/varlen_attention.py) and compared with the single-process model (the same kernels).

Usage: torchrun --standalone --nproc-per-node 4 varlen_worker.py CONFIG.json OUT_DIR
"""

from __future__ import annotations

import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

from scenario_runner import run_scenarios, sgd_steps_like_reference

from autoshard import AutoParallel, varlen_attention_on_cpu
from autoshard.models import Llama, LlamaConfig

RTOL, ATOL = 1e-5, 1e-6
VARLEN = "_varlen_attn"


def _packed_documents(lengths: list[list[int]]) -> torch.Tensor:
    """The int32 offsets of every row's documents, packed row after row."""
    offsets = [0]
    for row in lengths:
        for n in row:
            offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32)


def run_one(sc: dict, rank: int) -> dict:
    varlen_attention_on_cpu()
    dims = sc["dims"]
    mesh = init_device_mesh("cpu", tuple(sc["mesh"]), mesh_dim_names=tuple(dims))
    batch, seq = len(sc["documents"]), sc["seq"]
    cfg = LlamaConfig(
        dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=64,
        max_seq_len=seq, attention="varlen",
    )  # fmt: skip
    masks = (_packed_documents(sc["documents"]), seq)  # max_len: an upper bound, fixed
    torch.manual_seed(0)
    ref = Llama(cfg)
    with torch.device("meta"):
        model = Llama(cfg)
    with AutoParallel(
        model,
        lambda: (*(torch.zeros(batch, seq, dtype=torch.long) for _ in range(2)), masks),
        mesh,
        time_limit_s=20.0,
        strict=True,
    ) as autop:
        rows = {"tp": Shard(1), "dp": Shard(0)}  # [T, H, D]: heads on tp, tokens on dp
        pinned = tuple(rows.get(d, Replicate()) for d in dims)
        for n in autop.gm.graph.nodes:
            if VARLEN in str(n.target):  # out / grad_q
                autop.add_node_constraint(n.name, pinned)
        result = autop.optimize_placement()
        parallel = autop.apply_placement(result)
    parallel.to_empty(device="cpu")
    parallel.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(1)
    step_inputs = [
        (*(torch.randint(0, 64, (batch, seq), generator=g) for _ in range(2)), masks)
        for _ in range(3)
    ]
    steps = sgd_steps_like_reference(parallel, ref, step_inputs, RTOL, ATOL)
    nodes = result.plan["nodes"]
    return {
        "name": sc["name"],
        "ok": True,
        "steps": steps,
        "attention": {
            n: {"inputs": e.get("inputs"), "outputs": e.get("outputs")}
            for n, e in nodes.items()
            if VARLEN in n
        },
    }


if __name__ == "__main__":
    sys.exit(run_scenarios(run_one))
