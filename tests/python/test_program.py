"""Lowering a plan to per-rank graphs (program/lowering.py) and overlapping their collectives
(overlap.py), checked in one process on a fake 4-rank process group: lowering only traces
with fake tensors, so no collective has to run. Numerics of the lowered program on real
gloo ranks: test_autoparallel_dist.py, test_runtime_dist.py, test_comm_count.py."""

import operator

import pytest
import torch
import torch.fx as fx

from torch.distributed.tensor import DTensor, Shard

from autoshard import _core
from autoshard.api.autoparallel import AutoParallel
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.trace.fake_pg import fake_world
from autoshard.models import MLP
from autoshard.program.passes.overlap import _reads_an_input, block_of, schedule_collectives
from autoshard.program.graph_nodes import is_collective, is_wait, op_name
from autoshard.program.passes.in_place import divide_in_place
from autoshard.trace.tracer import trace_training_step
from autoshard.runtime.module_runtime import runtime_of

needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


def _fsdp_module(mesh, prefetch_bytes=None, bucket_bytes=0, budget=None, dim=16):
    """A 3-block MLP planned by the C++ planner under the default budget (1/4 of the
    parameters per rank) with a batch-sharded input: FSDP (weights gathered before use,
    gradients reduce-scattered); ``budget=(1, 1)`` and a larger ``dim``: DDP."""
    with torch.device("meta"):
        model = MLP(dim=dim, hidden=2 * dim, layers=3)
    with AutoParallel(
        model,
        lambda: (torch.empty(4096, dim), torch.empty(4096, dim)),
        mesh,
        hardware="CPU",
        capture="direct",
        time_limit_s=5.0,
    ) as autop:
        autop.add_input_constraints([(Shard(0),), (Shard(0),)])
        autop.add_parameter_memory_constraint(*(budget or ()))
        par = autop.apply_placement(autop.optimize_placement())
    rt = runtime_of(par)
    # bucket_bytes 0: one collective per tensor, as traced
    rt.options = rt.options.replace(prefetch_bytes=prefetch_bytes, bucket_bytes=bucket_bytes)
    par.to_empty(device="cpu")
    return par, autop.step


# bucketed: blocks of 4 MiB of weights, so that each block keeps its own bucket (a smaller
# block's collectives join the next block's: overlap.SMALL_GROUP_BYTES)
@pytest.fixture(scope="module", params=[(0, 16), (None, 512)], ids=["unbucketed", "bucketed"])
def mlp_program(request):
    if not hasattr(_core, "plan_graph"):
        pytest.skip("the C++ planner (_core.plan_graph) is not built")
    bucket_bytes, dim = request.param
    with fake_world((4,), device_type="cpu") as mesh:
        par, step = _fsdp_module(mesh, bucket_bytes=bucket_bytes, dim=dim)
        fwd, bwd = par.parallel_gm, par.parallel_bwd_gm  # lowered: no process group needed
    return par, step, fwd, bwd


def _order(gm):
    return {n: i for i, n in enumerate(gm.graph.nodes)}


def test_graphs_hold_only_local_aten_and_functional_collectives(mlp_program):
    par, step, fwd, bwd = mlp_program
    for gm in (fwd, bwd):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is not operator.getitem:
                ns = getattr(n.target, "namespace", None)
                assert ns in ("aten", "_c10d_functional", "prims"), n.target
        assert not any("DTensor" in type(n.meta.get("val")).__name__ for n in gm.graph.nodes)
    colls = runtime_of(par).program.collectives()
    # FSDP-like: the sharded weights are gathered in forward and their gradients reduced
    sharded = [n for n, p in par.named_parameters() if p.to_local().numel() < p.numel()]
    fwd_gathers = [
        c for c in colls if c["phase"] == "forward" and c["op"] == "all_gather_into_tensor"
    ]
    bwd_reductions = [
        c
        for c in colls
        if c["phase"] == "backward" and c["op"] in ("reduce_scatter_tensor", "all_reduce")
    ]

    def members(c):  # a bucket gathers several tensors
        where = c["where"]
        return len(where.split(", ")) if where.startswith("bucket of ") else 1

    assert len(sharded) >= 6 and sum(members(c) for c in fwd_gathers) >= len(sharded)
    assert len(bwd_reductions) >= 1
    assert all(c["where"] for c in colls)


def test_no_view_that_changes_nothing_is_left(mlp_program):
    """to_local / from_local leave same-shape views and detaches; each would be a dispatched
    op per step."""
    _, _, fwd, bwd = mlp_program
    for gm in (fwd, bwd):
        for n in gm.graph.nodes:
            assert op_name(n) not in ("detach", "alias"), n.format_node()
            if op_name(n) in ("view", "reshape", "_unsafe_view"):
                src, val = n.args[0].meta["val"], n.meta["val"]
                assert (src.shape, src.stride()) != (val.shape, val.stride()), n.format_node()


def test_waits_sit_right_before_first_use(mlp_program):
    _, _, fwd, bwd = mlp_program
    for gm in (fwd, bwd):
        order = _order(gm)
        nodes = list(gm.graph.nodes)
        for n in nodes:
            if is_wait(n):
                first_use = min(order[u] for u in n.users)
                between = nodes[order[n] + 1 : first_use]
                assert all(
                    is_wait(b) or is_collective(b) for b in between
                ), f"{n.name} waited {len(between)} ops before its use"


def test_next_block_weights_are_gathered_before_this_block_computes(mlp_program):
    """Prefetch: under the default budget, the all-gather of a later block's weight is
    issued before the compute op that reads an earlier block's gathered weight (FSDP's
    prefetch, here as deep as the byte budget allows)."""
    _, _, fwd, _ = mlp_program
    order = _order(fwd)

    def consumer(c):  # the first compute op reading the gathered value
        w = next(iter(c.users))
        return min(w.users, key=order.__getitem__)

    gathers = [
        n
        for n in fwd.graph.nodes
        if is_collective(n)
        and "all_gather" in str(n.target)
        and (_reads_an_input(n.args[0]) or op_name(n.args[0]) == "cat")
    ]
    uses = sorted((order[consumer(c)], c) for c in gathers)
    assert len(uses) >= 3  # one per block, or one per weight
    for (use_a, _), (use_b, c_b) in zip(uses, uses[1:]):
        if use_b > use_a:
            assert order[c_b] < use_a, f"{c_b.name} issued at {order[c_b]}, after {use_a}"


@needs_planner
def test_prefetch_budget_bounds_bytes_in_flight():
    with fake_world((4,), device_type="cpu") as mesh:
        par, step = _fsdp_module(mesh, prefetch_bytes=0)  # no prefetch: gathers wait for use
        fwd = par.parallel_gm
        order = _order(fwd)
        for n in fwd.graph.nodes:
            if is_collective(n) and "all_gather" in str(n.target):
                w = next(iter(n.users))
                assert order[w] == order[n] + 1 or all(
                    is_collective(x) or is_wait(x)
                    for x in list(fwd.graph.nodes)[order[n] + 1 : order[w]]
                )
        report = runtime_of(par).program.info["forward_schedule"]
        assert report["deferred_by_budget"] > 0


@needs_planner
def test_parameter_gathers_and_gradient_reductions_are_bucketed():
    """Default buckets: the forward's parameter gathers become one collective per block
    (each block, 4 MiB, is far below the 25 MiB cap), as FSDP2 wrapping every block does.
    Numerics of bucketed programs (gathers and DDP-style gradient all-reduce buckets) are
    checked on gloo ranks (test_autoparallel_dist.py)."""
    with fake_world((4,), device_type="cpu") as mesh:
        par, _ = _fsdp_module(mesh, bucket_bytes=None, dim=512)
        par.parallel_gm
    info = runtime_of(par).program.info
    blocks = {block_of(n) for n, p in par.named_parameters() if p.to_local().numel() < p.numel()}
    assert len(blocks) == 3  # layers.0, layers.1, layers.2
    assert info["forward_gather_buckets"]["buckets"] == len(blocks)
    colls = runtime_of(par).program.collectives()
    buckets = [
        c
        for c in colls
        if c["phase"] == "forward"
        and c["op"] == "all_gather_into_tensor"
        and c["where"].startswith("bucket of ")
    ]
    held = sum(p.to_local().numel() for p in par.parameters() if p.to_local().numel() < p.numel())
    assert len(buckets) == len(blocks) and 0 < sum(c["numel"] for c in buckets) <= held


@needs_planner
def test_small_blocks_share_a_bucket():
    """Blocks of a few KiB: a collective's fixed cost dwarfs sending their bytes, so a
    block whose gathers or gradient reductions come to less than SMALL_GROUP_BYTES joins
    the next block's bucket; here all three blocks' gathers go in one call."""
    with fake_world((4,), device_type="cpu") as mesh:
        par, _ = _fsdp_module(mesh, bucket_bytes=None, dim=16)
        par.parallel_gm
    assert runtime_of(par).program.info["forward_gather_buckets"]["buckets"] == 1
    gathers = [
        c
        for c in runtime_of(par).program.collectives()
        if c["phase"] == "forward" and c["op"] == "all_gather_into_tensor"
    ]
    assert len(gathers) == 1 and gathers[0]["where"].startswith("bucket of ")


@needs_planner
def test_gathers_of_cast_weight_shards_are_bucketed_per_block():
    """Mixed precision gathers each weight after its down-cast (FSDP2's order): the gathered
    values are copies of graph inputs, not the inputs themselves. Their casts are moved to
    the top of the graph and the gathers bucketed per block like plain shards (the cost
    model charges them a share of a launch, docs/cost_model.md 5a)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    with fake_world((4,), device_type="cpu") as mesh:
        with torch.device("meta"):  # bf16 weights of 2 MiB per block: a bucket each
            model = MLP(dim=512, hidden=1024, layers=3)
        with AutoParallel(
            model,
            lambda: (torch.empty(4096, 512), torch.empty(4096, 512)),
            mesh,
            hardware="CPU",
            capture="direct",
            time_limit_s=5.0,
            mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16),
        ) as autop:
            autop.add_input_constraints([(Shard(0),), (Shard(0),)])
            autop.add_parameter_memory_constraint()
            par = autop.apply_placement(autop.optimize_placement())
        par.to_empty(device="cpu")
        fwd = par.parallel_gm
    assert runtime_of(par).program.info["forward_gather_buckets"]["buckets"] == 3
    buckets = [
        n
        for n in fwd.graph.nodes
        if is_collective(n)
        and "all_gather" in str(n.target)
        and (n.meta.get("custom") or {}).get("autoshard_node", "").startswith("bucket")
    ]
    assert len(buckets) == 3
    assert all(n.args[0].meta["val"].dtype == torch.bfloat16 for n in buckets)
    order = _order(fwd)
    first_mm = min(order[n] for n in fwd.graph.nodes if op_name(n) in ("mm", "addmm"))
    assert order[buckets[1]] < first_mm  # the second block's bucket is prefetched


@needs_planner
def test_gradient_all_reduces_are_bucketed_per_block():
    """DDP-like plan: one all-reduce bucket per block, issued when that block's gradients
    exist (before the earlier blocks' backward compute), not one bucket at the end."""
    with fake_world((4,), device_type="cpu") as mesh:
        par, _ = _fsdp_module(mesh, bucket_bytes=None, budget=(1.0, 1.0), dim=256)
        bwd = par.parallel_bwd_gm
    # 3 blocks of 1 MiB of weights and biases: a bucket each (a small first bucket, DDP's,
    # only when there are no blocks)
    assert runtime_of(par).program.info["backward_reduction_buckets"]["buckets"] == 3
    order = _order(bwd)
    buckets = [
        n
        for n in bwd.graph.nodes
        if is_collective(n)
        and op_name(n) == "all_reduce"
        and (n.meta.get("custom") or {}).get("autoshard_node", "").startswith("bucket")
    ]
    mms = [order[n] for n in bwd.graph.nodes if op_name(n) in ("mm", "addmm")]
    # what runs: each bucket's concatenation is a fresh buffer read by nothing else, reduced
    # in place (reduce_in_place) without the copy the functional all_reduce makes first
    runs = runtime_of(par).program.bwd.graph.nodes
    in_place = [n for n in runs if op_name(n) == "all_reduce_"]
    assert len(in_place) == 3 and not any(op_name(n) == "all_reduce" for n in runs)
    # (the eager program calls cat through its Python binding: direct_calls.py)
    assert all(n.args[0].target is torch.cat and len(n.args[0].users) == 1 for n in in_place)
    assert len(buckets) == 3
    assert order[buckets[0]] < max(mms)  # the last block's bucket overlaps earlier backward


def test_block_of_names_the_repeated_block():
    assert block_of("layers.3.attn.wq.weight") == "layers.3"
    assert block_of("model.encoder.layer.11.output.dense.bias") == "model.encoder.layer.11"
    assert block_of("embed.weight") == "" and block_of("weight") == ""
    assert block_of(None) is None


def test_collectives_keep_their_traced_issue_order(mlp_program):
    """Ranks must issue collectives in one order; the schedule never swaps two."""
    par, step, fwd, bwd = mlp_program
    for phase, gm in (("forward", fwd), ("backward", bwd)):
        issued = [n.name for n in gm.graph.nodes if is_collective(n)]
        traced = [c["node"] for c in runtime_of(par).program.collectives() if c["phase"] == phase]
        assert issued == traced
        # scheduling again changes nothing
        before = [n.name for n in gm.graph.nodes]
        schedule_collectives(gm)
        assert [n.name for n in gm.graph.nodes] == before


def test_no_wait_holds_back_a_collective_that_does_not_need_it(mlp_program):
    """Within one gap the collectives are issued before the waits nothing there needs: the
    last gradient bucket is not held back until the previous bucket is done."""
    _, _, fwd, bwd = mlp_program
    for gm in (fwd, bwd):
        nodes = list(gm.graph.nodes)
        for w, c in zip(nodes, nodes[1:]):
            if is_wait(w) and is_collective(c):
                assert w in _ancestors(c), f"{c.name} waits for {w.name} for nothing"


def _ancestors(n):
    seen, stack = set(), [n]
    while stack:
        for i in stack.pop().all_input_nodes:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen


def _tiny_mlp():
    """A one-block MLP on the meta device and its traced step."""
    with torch.device("meta"):
        model = MLP(dim=8, hidden=8, layers=1)
    step = trace_training_step(
        model, lambda: (torch.empty(4, 8), torch.empty(4, 8)), capture="direct"
    )
    return model, step


def test_replicated_plan_has_no_collectives_and_needs_no_schedule():
    with fake_world((2,), device_type="cpu") as mesh:
        model, step = _tiny_mlp()
        par = build_parallel_module(model, step, {"nodes": {}}, mesh)
        assert runtime_of(par).program is None  # nothing to lower from on the meta device
        par.to_empty(device="cpu")
        assert runtime_of(par).program.collectives() == []


def test_unknown_runtime_and_compile_with_interpreter_are_refused():
    with fake_world((2,), device_type="cpu") as mesh:
        model, step = _tiny_mlp()
        with pytest.raises(ValueError, match="runtime must be one of"):
            build_parallel_module(model, step, {"nodes": {}}, mesh, runtime="eager")
        with pytest.raises(ValueError, match="compile=True compiles the lowered program"):
            build_parallel_module(
                model, step, {"nodes": {}}, mesh, runtime="interpret", compile=True
            )


class _DTensorOut(torch.nn.Module):
    """A user's wrapper returning the parallel module's local output as a DTensor."""

    def __init__(self, inner, mesh):
        super().__init__()
        self.inner, self.mesh = inner, mesh

    def forward(self, x):
        return DTensor.from_local(self.inner(x), self.mesh, (Shard(0),), run_check=False)


@needs_planner
@pytest.mark.parametrize("program_compiled", [False, True], ids=["eager", "compile=True"])
def test_torch_compile_fullgraph_of_the_module_with_dtensor_output(program_compiled):
    """torch.compile(fullgraph=True) traces the program (lowered when the state was
    materialised, not under Dynamo), and a DTensor output's tangent flows back: the
    gradients equal the uncompiled module's, also when the program's own graphs are
    compiled (compile=True)."""
    with fake_world((2,), device_type="cpu") as mesh:
        with torch.device("meta"):
            model = torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)
            )
        with AutoParallel(
            model,
            lambda: (torch.empty(64, 16),),
            mesh,
            hardware="CPU",
            capture="direct",
            time_limit_s=5.0,
            compile=program_compiled,
        ) as autop:
            autop.add_input_constraints([(Shard(0),)])
            autop.add_output_constraints([(Shard(0),)])
            autop.add_parameter_memory_constraint()
            par = autop.apply_placement(autop.optimize_placement())
        par.to_empty(device="cpu")
        torch.manual_seed(0)
        for p in par.parameters():
            torch.nn.init.normal_(p.to_local())
        x = torch.randn(32, 16)
        grads = []
        for wrapped in (
            _DTensorOut(par, mesh),
            torch.compile(_DTensorOut(par, mesh), fullgraph=True),
        ):
            out = wrapped(x)
            assert isinstance(out, DTensor)
            (out * out).sum().backward()  # a DTensor tangent
            grads.append([p.grad.to_local().clone() for p in par.parameters()])
            par.zero_grad(set_to_none=True)
        for eager, compiled in zip(*grads):
            torch.testing.assert_close(compiled, eager)


def test_program_is_lowered_again_when_the_state_changes_dtype():
    with fake_world((2,), device_type="cpu") as mesh:
        model, step = _tiny_mlp()
        par = build_parallel_module(model, step, {"nodes": {}}, mesh)
        par.to_empty(device="cpu")
        first = runtime_of(par).program
        par.to(torch.float64)
        assert runtime_of(par).program is not first
        placeholders = [n for n in par.parallel_gm.graph.nodes if n.op == "placeholder"]
        assert placeholders[0].meta["val"].dtype == torch.float64


def _reduced_then_divided(extra_reader: bool) -> fx.GraphModule:
    """cat -> all_reduce_ -> wait -> div by a 0-dim count (late_loss_scale's division of a
    gradient bucket), the wait optionally read by one more node."""
    c10d = torch.ops._c10d_functional
    g = fx.Graph()
    a, b, count = (g.placeholder(n) for n in ("a", "b", "count"))
    for node, val in ((a, torch.ones(3)), (b, torch.ones(2)), (count, torch.tensor(2.0))):
        node.meta["val"] = val
    buf = g.call_function(torch.ops.aten.cat.default, ([a, b],))
    buf.meta["val"] = torch.ones(5)
    red = g.call_function(c10d.all_reduce_.default, (buf, "sum", "0"))
    wait = g.call_function(c10d.wait_tensor.default, (red,))
    wait.meta["val"] = torch.ones(5)
    div = g.call_function(torch.ops.aten.div.Tensor, (wait, count))
    outs = [div, g.call_function(torch.ops.aten.mul.Tensor, (wait, 2))] if extra_reader else [div]
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


def test_a_reduced_bucket_is_divided_in_place_only_when_nothing_else_reads_it():
    gm = _reduced_then_divided(extra_reader=False)
    assert divide_in_place(gm) == 1
    div = next(n for n in gm.graph.nodes if "div" in str(n.target))
    assert div.target is torch.ops.aten.div_.Tensor
    # the wait is read twice: dividing in place would change what the other reader sees
    gm = _reduced_then_divided(extra_reader=True)
    assert divide_in_place(gm) == 0
