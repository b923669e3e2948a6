"""One gather bucket's buffer at a time: a bucket's input (its members' casts, pads,
flattening and concatenation) is built right where its all-gather is issued, not at the top
of the step, where every bucket's buffer would stay live until its turn (about one more copy
of the rank's parameter shards at the activation peak)."""

import pytest
import torch
import torch.distributed as dist

from autoshard import _core
from autoshard.runtime.inputs import example_local_inputs
from autoshard.runtime.module_runtime import runtime_of, traced_buffers, traced_params
from autoshard.runtime.parallel_module import build_parallel_module
from autoshard.program.graph_nodes import op_name
from autoshard.program.lowering import lower_step
from test_uneven_ranks import _fresh_world, _plan, gpt

pytestmark = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


@pytest.fixture
def fake_worlds():
    """The fake process groups _plan and _fresh_world start are gone after the test: a
    default group left behind would be every later test's."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_each_gather_bucket_is_built_where_it_is_issued(fake_worlds):
    make_model = gpt()
    plan, step = _plan(make_model, 8, (4,), ("dp",), "default")
    mesh = _fresh_world(4, 1, (4,), ("dp",))
    with torch.device("meta"):
        model = make_model()
    module = build_parallel_module(model, step, plan, mesh)
    module.to_empty(device="cpu")
    runner = runtime_of(module).runner
    program = lower_step(
        runner,
        [p._local_tensor for p in traced_params(module, runtime_of(module))],
        [b._local_tensor for b in traced_buffers(module, runtime_of(module))],
        example_local_inputs(runner),
    )
    buckets = [
        n
        for gm in (program.fwd_gm, program.bwd_gm)
        for n in gm.graph.nodes
        if op_name(n) == "all_gather_into_tensor" and op_name(n.args[0]) == "cat"
    ]
    assert buckets, "the FSDP-like plan should gather its parameters in buckets"
    for c in buckets:
        cat = c.args[0]
        assert c.prev is cat, f"{c.name}: its bucket {cat.name} is built before other ops"
        # each member's flattening (or cast, or pad) sits with the bucket too; a 1-D shard
        # is its own flattening (a graph input)
        for flat in (f for f in cat.args[0] if f.op == "call_function"):
            between, n = [], flat.next
            while n is not cat:
                between.append(n)
                n = n.next
            assert all(
                op_name(b) in ("reshape", "view", "_to_copy", "constant_pad_nd", "cat")
                or b in cat.args[0]
                for b in between
            ), (
                f"{c.name}: compute between {flat.name} and {cat.name}: "
                f"{[b.name for b in between if b not in cat.args[0]]}"
            )
    assert program.info["forward_schedule"]["inputs_built_at_issue"] > 0
