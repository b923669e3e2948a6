"""rng_check.py on what a GPU run produces: on CUDA, DTensor's offset-based RNG tracker
traces a random op as the higher-order op ``run_dtensor_rng_op`` (no op tags), which the
check must still see; and the generator compared is the one of the run's device (CUDA's
on GPU runs, not the CPU's). Emulated on this CPU build: fake CUDA tensors, a fake CUDA
mesh, and stubs of the torch.cuda queries the tracker's constructor makes."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.distributed.tensor._random as dtensor_random
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.program import rng_check
from autoshard.trace.fake_pg import fake_world

run_dtensor_rng_op = pytest.importorskip("torch._prims.rng_prims").run_dtensor_rng_op


def _fake_cuda(*shape):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(*shape, device="cuda")


def _hop_graph():
    """What DTensor leaves in a traced program for dropout on CUDA."""

    def f(x):
        out, _mask = run_dtensor_rng_op(0, 64, torch.ops.aten.native_dropout.default, x, 0.5, True)
        return out * 2

    return make_fx(f, tracing_mode="fake")(_fake_cuda(4, 16))


def test_the_dtensor_rng_wrapper_is_a_random_node():
    gm = _hop_graph()
    found = rng_check.random_nodes(gm)
    assert [n.target for n in found] == [run_dtensor_rng_op], gm.graph
    # and the plain op, as traced on CPU, still is one
    gm_cpu = make_fx(lambda x: torch.ops.aten.native_dropout(x, 0.5, True))(torch.ones(4, 16))
    assert [n.target for n in rng_check.random_nodes(gm_cpu)] == [
        torch.ops.aten.native_dropout.default
    ]


@pytest.fixture
def cuda_rng_tracker():
    """DTensor's OffsetBasedRNGTracker on a fake 2-rank CUDA mesh: its constructor asks
    torch.cuda whether a device is there (stubbed; nothing else touches CUDA)."""
    with fake_world((2,), ("dp",), device_type="cuda") as mesh:
        with (
            mock.patch("torch.cuda.is_available", return_value=True),
            mock.patch("torch.cuda.device_count", return_value=1),
        ):
            tracker = dtensor_random.OffsetBasedRNGTracker(mesh, run_state_sync=False)
        saved, dtensor_random._rng_tracker = dtensor_random._rng_tracker, tracker
        try:
            yield mesh
        finally:
            dtensor_random._rng_tracker = saved


@pytest.mark.parametrize("layout", [Replicate(), Shard(0)])
def test_dtensor_dropout_traced_on_a_cuda_mesh_is_seen(cuda_rng_tracker, layout):
    mesh = cuda_rng_tracker

    def f(x):
        d = DTensor.from_local(x, mesh, (layout,), run_check=False)
        return torch.nn.functional.dropout(d, 0.5, True).to_local()

    gm = make_fx(f, tracing_mode="fake")(_fake_cuda(4, 16))
    hops = [n for n in gm.graph.nodes if n.target is run_dtensor_rng_op]
    assert hops, f"DTensor traced no run_dtensor_rng_op here:\n{gm.graph}"
    assert rng_check.random_nodes(gm) == hops
    # the tag-only check this replaces saw nothing in such a graph
    assert not [
        n
        for n in gm.graph.nodes
        if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
    ]


def test_replicated_dims_include_the_wrapped_dropout():
    gm = _hop_graph()
    hop = next(n for n in gm.graph.nodes if n.target is run_dtensor_rng_op)
    hop.meta["custom"] = {"autoshard_node": "dropout"}
    program = SimpleNamespace(fwd_gm=gm)
    layouts = {"dropout": (Shard(0), Replicate())}
    runner = SimpleNamespace(mesh=SimpleNamespace(ndim=2), planned_output=layouts.get)
    # sharded over dim 0 (ranks draw different slices), replicated over dim 1 (same values)
    assert rng_check.replicated_random_dims(program, runner) == {1: ["dropout"]}


def test_cpu_runs_compare_the_cpu_generator():
    torch.manual_seed(5)
    assert torch.equal(rng_check.generator_state(torch.device("cpu")), torch.get_rng_state())


def test_cuda_runs_compare_the_cuda_generator_of_their_device(monkeypatch):
    asked = []

    def cuda_state(device="cuda"):
        asked.append(torch.device(device))
        return torch.tensor([7, 7, 7], dtype=torch.uint8)

    def no_cpu_state():
        raise AssertionError("the CPU generator was read for a CUDA run")

    monkeypatch.setattr(torch.cuda, "get_rng_state", cuda_state)
    monkeypatch.setattr(torch, "get_rng_state", no_cpu_state)
    state = rng_check.generator_state(torch.device("cuda", 3))
    assert state.tolist() == [7, 7, 7] and asked == [torch.device("cuda", 3)]
    assert rng_check._state_digest(torch.device("cuda", 3)) == rng_check._state_digest(
        torch.device("cuda", 3)
    )


def test_a_cuda_digest_ignores_the_cpu_generator(monkeypatch):
    """Ranks seeded alike on the GPU but drawing per-rank data on the CPU must agree."""
    cuda_state = torch.ones(8, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": cuda_state)
    torch.manual_seed(1)
    first = rng_check._state_digest(torch.device("cuda", 0))
    torch.manual_seed(2)
    assert rng_check._state_digest(torch.device("cuda", 0)) == first
    assert rng_check._state_digest(torch.device("cpu")) != first


def test_a_device_without_a_readable_generator_is_named():
    with pytest.raises(RuntimeError, match=r"device type 'meta'.*get_rng_state"):
        rng_check.generator_state(torch.device("meta"))
