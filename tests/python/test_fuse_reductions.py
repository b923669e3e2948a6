"""fuse_reductions.py on hand-written local graphs (fake process group): the Partial-sum /
reduced-count pattern of a mean loss becomes one all-reduce, results keep their values, and
reductions that depend on each other or are large are left alone. The 4-rank numerics of
the rewritten loss are checked in test_comm_count.py (cross_entropy scenarios)."""

import pytest
import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.trace.fake_pg import fake_world
from autoshard.program.passes.fuse_reductions import (
    coalesce_small_reductions,
    count_targets_early,
    split_normalised_reductions,
)
from autoshard.program.graph_nodes import is_collective

c10d = torch.ops._c10d_functional


def _reduced(x, group):
    return c10d.wait_tensor(c10d.all_reduce(x, "sum", group))


def _trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _collectives(gm):
    return [n for n in gm.graph.nodes if is_collective(n)]


@pytest.fixture
def group():
    with fake_world((4,), device_type="cpu"):
        yield dist.group.WORLD.group_name


def test_normalised_partial_sum_and_its_count_become_one_all_reduce(group):
    def mean_loss(loss_sum, count, other):
        total = _reduced(count, group)
        loss = _reduced(loss_sum / total, group)
        return loss, total * 2, other + 1

    args = (torch.tensor(6.0), torch.tensor(3.0), torch.ones(2))
    gm = _trace(mean_loss, *args)
    expected = gm(*args)
    assert len(_collectives(gm)) == 2
    assert split_normalised_reductions(gm) == 1
    assert coalesce_small_reductions(gm) == 1
    (coll,) = _collectives(gm)
    assert coll.meta["val"].numel() == 2  # the sum and the count, side by side
    for got, want in zip(gm(*args), expected):
        torch.testing.assert_close(got, want)


def test_multiplying_by_a_reduced_scale_is_linear_too(group):
    def scaled(x, scale):
        return _reduced(_reduced(scale, group) * x, group)

    gm = _trace(scaled, torch.tensor(2.0), torch.tensor(0.5))
    assert split_normalised_reductions(gm) == 1
    assert coalesce_small_reductions(gm) == 1


def test_a_reduction_that_needs_another_ones_result_is_not_merged(group):
    def dependent(a, b):
        first = _reduced(a, group)
        return _reduced(b + first.exp(), group)  # not linear: needs the first result

    gm = _trace(dependent, torch.tensor(1.0), torch.tensor(2.0))
    assert split_normalised_reductions(gm) == 0
    assert coalesce_small_reductions(gm) == 0
    assert len(_collectives(gm)) == 2


def test_large_reductions_are_left_to_the_gradient_buckets(group):
    def two_large(a, b):
        return _reduced(a, group), _reduced(b, group)

    gm = _trace(two_large, torch.ones(8192), torch.ones(8192))
    assert coalesce_small_reductions(gm) == 0
    gm = _trace(two_large, torch.ones(8), torch.ones(8, dtype=torch.float64))
    assert coalesce_small_reductions(gm) == 0  # different dtypes cannot share a buffer


def test_the_count_of_targets_is_reduced_where_the_targets_exist(group):
    """nll_loss's total weight depends on the targets alone: it is counted from them at the
    top of the graph and its all-reduce issued there, not after the logits are computed; the
    count is the same, and no longer merged with the loss sum's late all-reduce."""
    aten = torch.ops.aten

    def loss_of(x, w, target):
        logp = torch.log_softmax(x @ w, dim=-1)  # the large compute the count need not wait for
        total, weight = aten.nll_loss_forward.default(logp, target.view(-1), None, 2, -100)
        count = _reduced(weight, group)
        return _reduced(total, group) / count, count

    target = torch.arange(512).remainder(16).view(2, 256)
    target[0, :100] = -100
    args = (torch.randn(512, 8), torch.randn(8, 16), target)  # logits: 8192 elements
    gm = _trace(loss_of, *args)
    expected = gm(*args)
    assert count_targets_early(gm) == 1
    assert coalesce_small_reductions(gm) == 0  # a large matmul lies between the two
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    first = _collectives(gm)[0]
    mm = next(n for n in gm.graph.nodes if n.target == aten.mm.default)
    assert order[first] < order[mm] and first.args[0].meta["val"].numel() == 1
    got = gm(*args)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert float(got[1]) == 412.0  # targets not ignored (one rank's view of the fake group)


def test_the_forward_does_not_wait_for_its_last_small_round_trip(group):
    """deferred_tail.split_forward: the wait of the loss sum's all-reduce and the division
    after it move to an epilogue run on first use; making a tensor like the deferred loss
    (the seed of loss.backward()) does not run it, reading it does, once. A round trip whose
    result is saved for the backward stays in the forward."""
    from autoshard.program.passes.deferred_tail import DeferredValue, PendingTail, split_forward

    def forward(x, count):
        total = _reduced(count, group)  # saved for the backward: waited in the forward
        y = x * 2
        return _reduced(y.sum(), group) / total, y, total

    args = (torch.randn(3), torch.tensor(3.0))
    gm = _trace(forward, *args)
    expected = gm(*args)
    split = split_forward(gm, n_outputs=2)
    assert split.from_tail == [0] and split.from_main == [1, 2]
    got = split.main(*args)
    pending = PendingTail(split, list(got[2:]))
    loss = DeferredValue(split.tail_vals[0], pending, 0, got[2].device)
    seed = torch.ones_like(loss)
    assert pending.values is None and type(seed) is torch.Tensor and seed.shape == loss.shape
    torch.testing.assert_close(loss * 1, expected[0])
    assert pending.values is not None and float(loss) == float(expected[0])
    torch.testing.assert_close(got[0], expected[1])
