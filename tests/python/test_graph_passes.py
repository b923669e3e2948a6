"""autoshard.graph_passes (AutoParallel's graph-metric names): the two-stream replay of a
per-rank graph against hand-computed timelines, and the cost-model estimator on a planned
module's parallel_gm."""

import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard import AutoParallel
from autoshard.graph_passes.debug_helpers import (
    _is_communication_node,
    make_custom_runtime_estimation,
)
from autoshard.graph_passes.estimate_graph_metrics import (
    DEFAULT_LAUNCH_OVERHEAD_US as LAUNCH,
    GraphMetrics,
    estimate_graph_metrics,
)
from autoshard.trace.fake_pg import fake_world


def _by_target(times: dict):
    """An estimator from a table: op name -> microseconds (0 for anything else)."""

    def estimate(node):
        name = getattr(node.target, "__name__", "").split(".")[0]
        return times.get(name, 0.0)

    return estimate


def test_compute_only_graph_is_its_kernels_and_launches():
    gm = make_fx(lambda a, b, c: torch.relu(a @ b) @ c, tracing_mode="fake")(
        torch.randn(4, 8), torch.randn(8, 16), torch.randn(16, 2)
    )
    metrics = estimate_graph_metrics(gm, _by_target({"mm": 40.0, "relu": 5.0}))
    assert metrics == GraphMetrics(
        total_time=85.0 + 3 * LAUNCH,
        compute_time=85.0,
        communication_time=0.0,
        exposed_comm_time=0.0,
        peak_memory=metrics.peak_memory,
    )
    assert metrics.peak_memory > 0  # a CPU graph's tensors count


C10D = torch.ops._c10d_functional


@pytest.mark.parametrize("mm_us", [30.0, 80.0])
def test_wait_exposes_what_compute_did_not_hide(mm_us):
    """all_reduce (50 us) is issued after its launch and runs beside mm; the wait exposes
    what mm did not cover. Launches: all_reduce, mm, wait_tensor, add."""
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        group = mesh.get_group(0).group_name

        def step(x):
            reduced = C10D.all_reduce(x, "sum", group)
            local = x @ x
            return C10D.wait_tensor(reduced) + local

        gm = make_fx(step, tracing_mode="fake")(torch.randn(8, 8))
    metrics = estimate_graph_metrics(gm, _by_target({"all_reduce": 50.0, "mm": mm_us, "add": 10.0}))
    comm_end, mm_end = LAUNCH + 50.0, 2 * LAUNCH + mm_us
    assert metrics.exposed_comm_time == pytest.approx(max(0.0, comm_end - (mm_end + LAUNCH)))
    assert metrics.total_time == pytest.approx(max(comm_end, mm_end + LAUNCH) + LAUNCH + 10.0)
    assert metrics.communication_time == 50.0
    assert metrics.compute_time == mm_us + 10.0


def test_collectives_of_one_group_run_in_order():
    """Two all_reduces issued back to back on one group: the second starts when the first
    ends (at 1 + 50), so the second wait holds compute until 101."""
    with fake_world((4,), ("dp",), device_type="cpu") as mesh:
        group = mesh.get_group(0).group_name

        def step(x, y):
            a, b = C10D.all_reduce(x, "sum", group), C10D.all_reduce(y, "sum", group)
            return C10D.wait_tensor(a) + C10D.wait_tensor(b)

        gm = make_fx(step, tracing_mode="fake")(torch.randn(8), torch.randn(8))
    metrics = estimate_graph_metrics(gm, _by_target({"all_reduce": 50.0}))
    assert metrics.communication_time == 100.0
    # waits at 3 (to 51: 48 exposed) and at 52 (to 101: 49 exposed); the add's launch ends it
    assert metrics.exposed_comm_time == pytest.approx((LAUNCH + 50.0 - 3 * LAUNCH) + 50.0 - LAUNCH)
    assert metrics.total_time == pytest.approx(LAUNCH + 100.0 + LAUNCH)


class TwoLinear(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _planned_metrics(mesh, high_mem=None, train=True):
    with torch.device("meta"):
        model = TwoLinear()
    model.requires_grad_(train)
    batch = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)
    with AutoParallel(model, lambda: torch.rand(256, 64), mesh) as autop:
        autop.add_input_constraints([batch])
        autop.add_output_constraints([batch])
        autop.add_parameter_memory_constraint(low=0, high=high_mem)
        autop.apply_placement(autop.optimize_placement())
    gm = autop.parallel_gm
    return estimate_graph_metrics(gm, make_custom_runtime_estimation(mesh)), gm


def test_cost_model_estimator_prices_a_planned_step():
    """On a virtual 8-GPU mesh (priced as H100s): training gathers parameters and reduces
    gradients; inference only gathers, computes a third of the FLOPs and costs less."""
    with fake_world((8,), ("dp",), device_type="cpu") as mesh:
        train, gm = _planned_metrics(mesh)
        infer, _ = _planned_metrics(mesh, train=False)
    assert any(_is_communication_node(n) for n in gm.graph.nodes)
    assert train.communication_time > 0
    assert 0 <= train.exposed_comm_time <= train.communication_time + 1e-9
    assert train.compute_time > infer.compute_time > 0
    assert train.communication_time > infer.communication_time
    assert train.total_time > infer.total_time
    assert train.peak_memory > 0
