"""fuse_reductions.py on hand-written local graphs (fake process group): the Partial-sum /
reduced-count pattern of a mean loss becomes one all-reduce, results keep their values, and
reductions that depend on each other or are large are left alone. The 4-rank numerics of
the rewritten loss are checked in test_comm_count.py (cross_entropy scenarios)."""

import pytest
import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.fake_pg import fake_world
from autoshard.fuse_reductions import coalesce_small_reductions, split_normalised_reductions
from autoshard.program import is_collective

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
