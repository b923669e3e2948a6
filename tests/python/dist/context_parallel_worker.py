"""torchrun worker: context parallelism. A Llama-style model (causal SDPA, or FlexAttention with
a causal document mask passed as a BlockMask input) planned with its tokens' sequence dim
pinned to the ``cp`` mesh dim (load-balanced head-tail order unless the
scenario's options turn it off), trained 3 SGD steps on every rank (gloo) and compared with
the single-process model; reports the attention nodes' layouts, the collectives the lowered
program issues for them, and the (query, key) pairs each rank's attention calls allow (its
causal work), counted from the masks the local calls receive (FlexAttention: the pairs its
mask allows at the positions the rank's queries hold, what a block-sparse kernel computes; on
CPU the dense math computes every pair).

Usage: torchrun --standalone --nproc-per-node 4 context_parallel_worker.py CONFIG.json OUT_DIR
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import Counter

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.utils._python_dispatch import TorchDispatchMode

from scenario_runner import (
    compare_losses,
    compare_parameters,
    parallel_step,
    reference_step,
    run_scenarios,
)

from autoshard import AutoParallel, dense_flex_attention_on_cpu, document_head_tail_order
from autoshard.models import Llama, LlamaConfig
from autoshard.ops import attention_blocks
from autoshard.ops import context_parallel as cp

RTOL, ATOL = 1e-5, 1e-6
_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
ATTENTION = ("scaled_dot_product", "flex_attention")


def _is_attention(name: str) -> bool:
    return any(a in name for a in ATTENTION)


def _documents(batch: int, seq: int, starts: list[int]) -> torch.Tensor:
    """A packed-document table [batch, seq]: document i from position starts[i]."""
    doc = torch.zeros(batch, seq, dtype=torch.int64)
    for start in starts:
        doc[:, start:] += 1
    return doc


def _document_mask(doc: torch.Tensor, pos: torch.Tensor):
    """Causal within documents: ``doc`` and ``pos`` are each token's document and position,
    indexed as the mask's query / key indices (natural order, or the trainer's order)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal_document(b, h, q_idx, kv_idx):
        return (pos[b, kv_idx] <= pos[b, q_idx]) & (doc[b, q_idx] == doc[b, kv_idx])

    batch, seq = doc.shape
    return create_block_mask(causal_document, batch, None, seq, seq, device="cpu")


class FlexInputs:
    """The BlockMask (and positions) a scenario's model takes beside tokens and labels. With
    ``per_document`` the trainer reorders the sequence by document_head_tail_order (each
    rank the head and tail chunks of every document) and passes the positions: the parallel
    run gets the reordered inputs, the reference the natural ones."""

    def __init__(self, sc: dict, batch: int, seq: int, n_cp: int):
        starts = list(itertools.accumulate(sc.get("documents", []), initial=0))[:-1]
        self.doc = _documents(batch, seq, starts[1:])
        positions = torch.arange(seq).expand(batch, seq)
        self.natural = (_document_mask(self.doc, positions),)
        self.order = None
        if sc.get("per_document"):
            self.order = document_head_tail_order(sc["documents"], n_cp)
            doc, pos = self.doc[:, self.order], positions[:, self.order]
            self.parallel = (_document_mask(doc, pos), pos.contiguous())
            self.mask_tables = doc, pos  # what the parallel run's mask indexes
        else:
            self.parallel = self.natural
            self.mask_tables = self.doc, positions

    def reorder(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.order is None else x[:, self.order].contiguous()


def _document_pairs(tables, plan_entry, mesh, balanced, seq) -> int:
    """The (query, key) pairs the causal document mask allows for this rank's queries of a
    FlexAttention forward in ``plan_entry``'s layouts: the work of a block-sparse kernel.
    ``tables``: each mask index's document and position."""
    doc, pos = tables
    coordinate = mesh.get_coordinate()
    q_start, _ = cp.shard_starts(
        cp.FLEX_ATTENTION_OPS[0], plan_entry["inputs"], mesh.shape, coordinate.__getitem__, seq
    )
    stored = cp.storage_chunks(seq, balanced)
    n_q = _local_rows(plan_entry["inputs"][0], mesh, seq)
    q_pos = attention_blocks.chunk_positions(cp.chunks_of_range(stored, q_start, n_q))
    k_pos = attention_blocks.chunk_positions(stored)
    causal = pos[:, k_pos][:, None] <= pos[:, q_pos][:, :, None]
    same = doc[:, q_pos][:, :, None] == doc[:, k_pos][:, None]
    return int((causal & same).sum())


def _local_rows(layout, mesh, seq) -> int:
    for d, p in enumerate(layout):
        if p == "S(2)":
            seq //= mesh.shape[d]
    return seq


def _layout(mesh_dims: list[str], dim_of: dict[str, int]) -> tuple:
    return tuple(Shard(dim_of[n]) if n in dim_of else Replicate() for n in mesh_dims)


def _collectives(gm) -> list[tuple[str, str]]:
    """(joint-graph node, collective) for every collective node of a lowered graph."""
    out = []
    for n in gm.graph.nodes:
        name = getattr(n.target, "__name__", str(n.target))
        kind = next((c for c in _COLLECTIVES if c in name), None)
        if n.op == "call_function" and kind:
            out.append(((n.meta.get("custom") or {}).get("autoshard_node", "?"), kind))
    return out


class AttentionPairs(TorchDispatchMode):
    """Counts the (query, key) pairs the CPU flash-attention forward calls allow on this
    rank: the finite entries of their explicit mask (per batch and head), or the causal
    triangle of a call with ``is_causal`` and no mask."""

    OP = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def __init__(self):
        super().__init__()
        self.pairs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is self.OP:
            q, k = args[0], args[1]
            causal = len(args) > 4 and bool(args[4])
            mask = kwargs.get("attn_mask")
            n_q, n_k = q.shape[-2], k.shape[-2]
            if mask is not None:
                allowed = torch.isfinite(mask) if mask.is_floating_point() else mask
                if causal:
                    allowed = allowed & torch.ones(n_q, n_k, dtype=torch.bool).tril()
                plane = allowed.broadcast_to(*q.shape[:2], n_q, n_k)[0, 0]
                self.pairs += int(plane.sum())
            else:
                self.pairs += n_q * (n_q + 1) // 2 if causal else n_q * n_k
        return func(*args, **kwargs)


def run_one(sc: dict, rank: int) -> dict:
    dims = sc["dims"]
    mesh = init_device_mesh("cpu", tuple(sc["mesh"]), mesh_dim_names=tuple(dims))
    batch, seq = sc["batch"], sc["seq"]
    cfg = LlamaConfig(
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=64,
        ffn_dim=64,
        max_seq_len=seq,
        attention=sc.get("attention", "sdpa"),
    )
    flex = cfg.attention == "flex"
    # FlexAttention: a causal document mask, a BlockMask input as torchtitan passes it (the
    # same documents every step; its mask_mod reads the table at the mask's indices)
    n_cp = sc["mesh"][dims.index("cp")]
    extra = FlexInputs(sc, batch, seq, n_cp) if flex else None
    parallel_extra = extra.parallel if flex else ()
    torch.manual_seed(0)
    ref = Llama(cfg)
    with torch.device("meta"):
        model = Llama(cfg)
    # tokens / labels: batch over dp, sequence over cp
    layout = _layout(dims, sc.get("dim_of", {"dp": 0, "cp": 1}))
    t0 = time.perf_counter()
    with AutoParallel(
        model,
        lambda: (*(torch.zeros(batch, seq, dtype=torch.long) for _ in range(2)), *parallel_extra),
        mesh,
        time_limit_s=20.0,
        strict=True,
        **sc.get("options", {}),
    ) as autop:
        # the block mask's tensors (flattened after tokens and labels) left to the planner;
        # positions (last, where given) split as the tokens
        free = [None] * (len(autop.step.input_nodes) - 2 - len(parallel_extra[1:]))
        autop.add_input_constraints([layout, layout] + free + [layout] * len(parallel_extra[1:]))
        if sc.get("pin_attention", True):
            # the sequence row of every attention call (forward: out, backward: grad_q
            # Shard(2) on cp), so the run exercises it whatever the costs say for this
            # small model
            seq_row = _layout(dims, {"dp": 0, "cp": 2})
            stream = _layout(dims, {"dp": 0, "cp": 1})
            for n in autop.gm.graph.nodes:
                if _is_attention(str(n.target)):
                    autop.add_node_constraint(n.name, seq_row)
                # the residual stream ([B, S, dim] embedding and adds) too: the whole block
                # follows the sequence split
                val = n.meta.get("val")
                if (
                    str(n.target) in ("aten.embedding.default", "aten.add.Tensor")
                    and isinstance(val, torch.Tensor)
                    and tuple(val.shape) == (batch, seq, cfg.dim)
                ):
                    autop.add_node_constraint(n.name, stream)
        result = autop.optimize_placement()
        parallel = autop.apply_placement(result)
    plan_s = time.perf_counter() - t0
    parallel.to_empty(device="cpu")
    parallel.load_state_dict(ref.state_dict())
    loaded = compare_parameters(parallel, ref, 0.0, 0.0)
    nodes = result.plan["nodes"]
    attention = {
        n: {"inputs": e.get("inputs"), "outputs": e.get("outputs")}
        for n, e in nodes.items()
        if _is_attention(n)
    }
    # the layout q (a backward: grad_out and q) leaves its producer in: equal to the
    # attention's input layout means no redistribution (no gather) of q before attention
    for n in autop.gm.graph.nodes:
        if n.name in attention:
            backward = "backward" in n.name and not flex  # flex: q is the first input
            producers = n.args[:2] if backward else n.args[:1]
            attention[n.name]["q_producers"] = [
                (nodes.get(a.name) or {}).get("outputs", [None])[0] for a in producers
            ]
    opt = torch.optim.SGD(parallel.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    steps = []
    g = torch.Generator().manual_seed(1)
    counter = AttentionPairs()
    for i in range(3):
        tokens = tuple(torch.randint(0, 64, (batch, seq), generator=g) for _ in range(2))
        inputs = (*map(extra.reorder, tokens), *extra.parallel) if flex else tokens
        if i == 0 and not flex:  # this rank's attention work, from the local calls' masks
            with counter:
                loss = parallel_step(parallel, opt, inputs)
        else:
            loss = parallel_step(parallel, opt, inputs)
        with dense_flex_attention_on_cpu():  # the same math as the parallel run's on CPU
            ref_loss = reference_step(ref, ref_opt, (*tokens, *(extra.natural if flex else ())))
        steps.append(
            {
                **compare_losses(loss, ref_loss, RTOL, ATOL),
                **compare_parameters(parallel, ref, RTOL, ATOL),
            }
        )
    fwd = _collectives(parallel.parallel_gm)
    bwd = _collectives(parallel.parallel_bwd_gm)
    at_attention = Counter(
        f"{pas}:{node}:{kind}"
        for pas, cs in (("fwd", fwd), ("bwd", bwd))
        for node, kind in cs
        if _is_attention(node)
    )
    if flex:  # the pairs the document mask allows this rank's queries (first forward call)
        first = next(e for n, e in attention.items() if "backward" not in n)
        order = autop.step.load_balance
        balanced = order.n if order is not None else None
        counter.pairs = _document_pairs(extra.mask_tables, first, mesh, balanced, seq)
    return {
        "name": sc["name"],
        "ok": True,
        "loaded": loaded,
        "steps": steps,
        "attention": attention,
        "attention_collectives": dict(at_attention),
        "collectives_by_node": {"fwd": [list(c) for c in fwd], "bwd": [list(c) for c in bwd]},
        "collectives": {
            "fwd": dict(Counter(k for _, k in fwd)),
            "bwd": dict(Counter(k for _, k in bwd)),
        },
        "plan_seconds": plan_s,
        "attention_pairs": counter.pairs,
    }


if __name__ == "__main__":
    sys.exit(run_scenarios(run_one))
