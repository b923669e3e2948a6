"""late_loss_scale.py on hand-written forward / backward graphs (fake process group): the
backward's leading division by the reduced count moves to its end only when the gradients
are linear in the divided tangent alone, with the same results; otherwise nothing changes.
Real-rank numerics (ignored targets, ranks with different counts): test_comm_count.py
(cross_entropy_wide)."""

import pytest
import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.trace.fake_pg import fake_world
from autoshard.program.passes.late_loss_scale import scale_gradients_late
from autoshard.program.graph_nodes import is_wait, op_name

c10d = torch.ops._c10d_functional


@pytest.fixture
def group():
    with fake_world((4,), device_type="cpu"):
        yield dist.group.WORLD.group_name


def _programs(group, backward, x):
    """Forward: (x, local count) -> (loss, saved: reduced count, x); ``backward``: (count,
    x, tangent) -> gradients."""

    def forward(x, count):
        total = c10d.wait_tensor(c10d.all_reduce(count, "sum", group))
        return (x.sum() / total, total, x)

    count = torch.tensor(3.0)
    fwd = make_fx(forward, tracing_mode="fake")(x, count)
    saved = forward(x, count)[1:]
    bwd = make_fx(backward, tracing_mode="fake")(*saved, torch.tensor(1.0))
    return fwd, bwd, (x, count)


def _run(fwd, bwd, args):
    loss, *saved = fwd(*args)
    return loss, bwd(*saved, torch.tensor(2.0))


def _check(group, backward, x, rewritten: int):
    fwd, bwd, args = _programs(group, backward, x)
    loss, expected = _run(fwd, bwd, args)
    assert scale_gradients_late(fwd, bwd, n_outputs=1) == rewritten
    got_loss, got = _run(fwd, bwd, args)
    torch.testing.assert_close(got_loss, loss)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    return fwd, bwd


def test_a_linear_backward_divides_its_gradients_at_the_end(group):
    def backward(total, x, tangent):
        g = tangent / total
        h = (g * x).t().reshape(-1)
        return (h * 3 + g.expand(x.shape).reshape(-1), (g * x).sum(0))

    fwd, bwd = _check(group, backward, torch.randn(2, 3), rewritten=1)
    # the forward returns the count's all-reduce unwaited; the backward waits at its end
    saved = next(n for n in fwd.graph.nodes if n.op == "output").args[0][1]
    assert op_name(saved) == "all_reduce"
    tangent = [n for n in bwd.graph.nodes if n.op == "placeholder"][-1]
    assert all(op_name(u) != "div" for u in tangent.users)
    returned = next(n for n in bwd.graph.nodes if n.op == "output").args[0]
    for r in returned:
        assert op_name(r) == "div" and is_wait(r.args[1]), r.format_node()


@pytest.mark.parametrize("case", ["nonlinear", "quadratic", "another_tangent_path", "half"])
def test_anything_but_a_linear_backward_is_left_alone(group, case):
    def backward(total, x, tangent):
        g = tangent / total
        if case == "nonlinear":
            return ((g * x).clamp(-0.1, 0.1),)
        if case == "quadratic":
            return (g * g * x,)
        if case == "another_tangent_path":
            return (g * x + tangent,)
        return ((g * x).half(),)

    _check(group, backward, torch.randn(2, 3), rewritten=0)


def test_a_count_the_backward_reads_otherwise_is_left_alone(group):
    def backward(total, x, tangent):
        return ((tangent / total) * x + total,)

    _check(group, backward, torch.randn(2, 3), rewritten=0)
