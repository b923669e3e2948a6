"""Block-trace extrapolation (block_extrapolation.py): a model with many interchangeable layers is
traced with 3 and 4 of them and the rest extrapolated; the result must equal the full trace
exactly, and anything else must fall back to the full trace."""

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autoshard import _core
from autoshard.models import MLP, Llama, LlamaConfig
from autoshard.trace.tracer import trace_training_step
from autoshard.trace.block_extrapolation import (
    MIN_LAYERS,
    describe_step,
    find_layer_container,
    first_difference,
)

needs_planner = pytest.mark.skipif(
    not hasattr(_core, "plan_graph"), reason="the C++ planner (_core.plan_graph) is not built"
)


def _long(*shape):
    return torch.empty(shape, dtype=torch.long)


def _llama(n_layers, **kw):
    with torch.device("meta"):
        return Llama(LlamaConfig(n_layers=n_layers, **kw))


def _llama_inputs():
    return _long(2, 16), _long(2, 16)


def _mlp(n_layers):
    with torch.device("meta"):
        return MLP(16, 32, n_layers)


def _mlp_inputs():
    return torch.empty(8, 16), torch.empty(8, 16)


def _trace(model, inputs, caplog, **kw):
    """(the trace, extrapolated or fallen back; whether it extrapolated)."""
    with caplog.at_level(logging.INFO, logger="autoshard"):
        caplog.clear()
        fast = trace_training_step(model, inputs, **kw)
        extrapolated = any(
            r.getMessage().startswith("autoshard: traced 3 and 4 of") for r in caplog.records
        )
    return fast, extrapolated


def _both(model, inputs, caplog, **kw):
    """(extrapolated-or-fallen-back trace, full trace, whether it extrapolated)."""
    fast, extrapolated = _trace(model, inputs, caplog, **kw)
    full = trace_training_step(model, inputs, **{**kw, "extrapolate_layers": False})
    return fast, full, extrapolated


def _assert_same(a, b):
    assert first_difference(a, b) is None
    assert a.gm.code == b.gm.code
    assert describe_step(a) == describe_step(b)


@pytest.mark.parametrize("n_layers", [6, 8])
def test_llama_extrapolated_equals_full_trace(n_layers, caplog):
    fast, full, extrapolated = _both(_llama(n_layers), _llama_inputs, caplog)
    assert extrapolated
    assert any(
        f"traced 3 and 4 of {n_layers} layers of layers" in r.getMessage() for r in caplog.records
    )
    _assert_same(fast, full)
    assert fast.param_fqns == full.param_fqns
    assert f"layers.{n_layers - 1}.feed_forward.w3.weight" in fast.param_fqns.values()
    # every node carries its own value and metadata
    vals = [n.meta["val"] for n in fast.gm.graph.nodes if "val" in n.meta]
    assert len({id(v) for v in vals}) == len(vals)


def test_llama_sdpa_extrapolated_equals_full_trace(caplog):
    fast, full, extrapolated = _both(_llama(7, attention="sdpa"), _llama_inputs, caplog)
    assert extrapolated
    _assert_same(fast, full)


def test_mlp_stack_extrapolated_equals_full_trace(caplog):
    fast, full, extrapolated = _both(_mlp(7), _mlp_inputs, caplog)
    assert extrapolated
    _assert_same(fast, full)


class _BnBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16, bias=False)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x):
        return x + torch.relu(self.bn(self.lin(x)))


_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


class _BnStack(nn.Module):
    def __init__(self, n_layers):
        super().__init__()
        self.layers = nn.ModuleList(_BnBlock() for _ in range(n_layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def test_layers_writing_buffers_extrapolated_equals_full_trace(caplog):
    """BatchNorm layers write their running statistics (outputs of role mutation, and the
    None gradients of those buffers, which carry no descriptor)."""
    with torch.device("meta"):
        model = _BnStack(7)
    fast, full, extrapolated = _both(model, lambda: torch.empty(8, 16), caplog)
    assert extrapolated
    _assert_same(fast, full)
    written = [fast.buffer_fqns[o.grad_of] for o in fast.outputs if o.role == "mutation"]
    assert written == [f"layers.{k}.bn.{b}" for k in range(7) for b in _BN_BUFFERS]


def test_forward_only_extrapolated_equals_full_trace(caplog):
    fast, full, extrapolated = _both(_llama(6), _llama_inputs, caplog, joint=False)
    assert extrapolated  # its placeholders are named by position (arg7_1), renumbered
    _assert_same(fast, full)
    assert not fast.joint


def test_mixed_precision_equals_full_trace(caplog):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fast, full, extrapolated = _both(_mlp(6), _mlp_inputs, caplog, mp_policy=mp)
    # the policy's casts (no module path) belong to the layer they cast for, and the casts
    # of every parameter before the layers shift each layer's seq_nr with the depth
    assert extrapolated
    _assert_same(fast, full)
    assert fast.local_inputs == full.local_inputs


class _ScaledBlock(nn.Module):
    """A block whose forward uses its layer index as a constant."""

    def __init__(self, i):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.scale = 1.0 + i  # differs per layer: never interchangeable

    def forward(self, x):
        return F.relu(self.lin(x)) * self.scale


class _IndexBlock(nn.Module):
    """The same attributes except ``layer_idx`` (as transformers' layers), which forward
    uses: every 4th layer is different."""

    def __init__(self, i):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.layer_idx = i

    def forward(self, x):
        y = self.lin(x)
        return y * 0.5 if self.layer_idx % 4 == 3 else F.relu(y)


class _Stack(nn.Module):
    def __init__(self, blocks, widths=None):
        super().__init__()
        self.layers = nn.ModuleList(blocks)

    def forward(self, x, target):
        for layer in self.layers:
            x = layer(x)
        return ((x - target) ** 2).mean()


class _WideBlock(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(16, hidden)
        self.down = nn.Linear(hidden, 16)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class _ConstIndexStack(nn.Module):
    """The model's own loop passes the layer index into an op (a constant in the graph)."""

    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList(_WideBlock(32) for _ in range(n))

    def forward(self, x, target):
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        return ((x - target) ** 2).mean()


class _MiddleIndexBlock(_IndexBlock):
    """Only layer 3 differs: in an 8-layer stack neither the first 3 nor the last 4 hold it,
    so only the eager pass over the whole model (layers_run_alike) sees it."""

    def forward(self, x):
        y = self.lin(x)
        return y * 0.5 if self.layer_idx == 3 else F.relu(y)


class _TruncatedStack(_Stack):
    """The forward runs only the first 5 layers of the list (transformers' ``layers[:n]``
    with a smaller n): a 3- and a 4-layer trace look the same as for a full loop."""

    def forward(self, x, target):
        for layer in self.layers[:5]:
            x = layer(x)
        return ((x - target) ** 2).mean()


class _ConstantBlock(nn.Module):
    """A block that builds a tensor constant in forward (a get_attr node in the graph), as
    transformers' attention does: the same in every layer, or (``by_index``) made from the
    layer index, which the attribute check allows (transformers' layer_idx)."""

    def __init__(self, i, by_index=False):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.layer_idx = i
        self.by_index = by_index

    def forward(self, x):
        v = float(self.layer_idx) if self.by_index else 2.0
        return F.relu(self.lin(x)) * torch.tensor([v, v]).sum()


def _stack_inputs():
    return torch.empty(8, 16), torch.empty(8, 16)


def test_equal_tensor_constants_in_layers_are_extrapolated(caplog):
    with torch.device("meta"):
        model = _Stack([_ConstantBlock(i) for i in range(7)])
    fast, full, extrapolated = _both(model, _stack_inputs, caplog)
    assert extrapolated
    _assert_same(fast, full)  # describe_step compares the constants' values too
    assert sum(n.op == "get_attr" for n in fast.gm.graph.nodes) == 7


def test_names_that_skip_numbers_are_counted_alike(caplog, monkeypatch):
    """A trace drops nodes nothing reads, so a name base skips numbers (CLIP: add_1 in shared
    code, then add_3 in the first layer); the copies skip where their templates did."""
    pytest.importorskip("transformers")
    from autoshard._testing import hf_zoo

    monkeypatch.setattr(hf_zoo, "LAYERS", 6)
    model, inputs = hf_zoo.build("clip")
    fast, full, extrapolated = _both(model, inputs, caplog)
    assert extrapolated
    _assert_same(fast, full)


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_transformers_llama_extrapolated_equals_full_trace(mixed_precision, caplog):
    """transformers' decoder layers read two tensor constants each, and its mask code drops
    nodes before the layers (names skip numbers): both are extrapolated exactly, also under a
    mixed-precision policy (whose casts of every parameter come before the layers)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(input_ids=ids).logits.float().pow(2).mean()

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fast, full, extrapolated = _both(
        Loss(),
        lambda: (torch.randint(0, 128, (2, 16)),),
        caplog,
        **({"mp_policy": mp} if mixed_precision else {}),
    )
    assert extrapolated
    _assert_same(fast, full)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _Stack([_WideBlock(32) for _ in range(6)] + [_WideBlock(48)]),  # one wider layer
        lambda: _Stack([_ScaledBlock(i) for i in range(7)]),
        lambda: _Stack([_IndexBlock(i) for i in range(7)]),
        lambda: _ConstIndexStack(7),
        lambda: _Stack([_MiddleIndexBlock(i) for i in range(8)]),
        lambda: _TruncatedStack([_WideBlock(32) for _ in range(8)]),
        lambda: _Stack([_ConstantBlock(i, by_index=True) for i in range(7)]),
    ],
    ids=[
        "hidden-size",
        "attribute",
        "layer-index-in-forward",
        "index-constant",
        "middle-layer-differs",
        "forward-runs-fewer-layers",
        "tensor-constant-differs",
    ],
)
def test_layers_that_differ_fall_back_to_the_full_trace(make, caplog):
    with torch.device("meta"):
        model = make()
    fast, full, extrapolated = _both(model, _stack_inputs, caplog)
    assert not extrapolated
    _assert_same(fast, full)


def test_index_constant_fallback_says_why(caplog):
    with torch.device("meta"):
        model = _ConstIndexStack(7)
    with caplog.at_level(logging.INFO, logger="autoshard"):
        trace_training_step(model, _stack_inputs)
    assert any("tracing all 7 layers of layers" in r.getMessage() for r in caplog.records)


def test_containers():
    assert find_layer_container(_llama(3))[0] == "layers"
    with torch.device("meta"):
        assert find_layer_container(_Stack([_WideBlock(32)] * 4)) is None  # one module, 4x
        assert find_layer_container(_Stack([_ScaledBlock(i) for i in range(6)])) is None
        assert find_layer_container(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) is None


def test_under_threshold_and_turned_off_trace_fully(caplog, monkeypatch):
    # whether it extrapolates only: the full traces equal to these are the tests above
    for model, inputs in [(_llama(MIN_LAYERS - 1), _llama_inputs), (_mlp(2), _mlp_inputs)]:
        assert not _trace(model, inputs, caplog)[1]
    assert not _trace(_llama(6), _llama_inputs, caplog, extrapolate_layers=False)[1]
    monkeypatch.setenv("AUTOSHARD_TRACE_ALL_LAYERS", "1")
    assert not _trace(_llama(6), _llama_inputs, caplog)[1]


@needs_planner
def test_planner_gives_the_same_plan(monkeypatch):
    from torch.distributed.tensor import Replicate, Shard

    from autoshard import AutoParallel
    from autoshard.trace.fake_pg import fake_world

    def plan():
        with fake_world((2, 2), ("dp", "tp"), device_type="cpu") as mesh:
            with AutoParallel(_llama(6), _llama_inputs, mesh, plan_cache=False) as autop:
                autop.add_input_constraints([(Shard(0), Replicate())] * 2)
                result = autop.optimize_placement()
                step = autop.step
                extrapolated = step.joint_with_descriptors is None
                # AutoParallel's property traces every layer for it on first read
                code = autop.joint_with_descriptors.graph_module.code
                return step, getattr(result, "plan", result), extrapolated, code

    step_fast, plan_fast, extrapolated, code_fast = plan()
    monkeypatch.setenv("AUTOSHARD_TRACE_ALL_LAYERS", "1")
    step_full, plan_full, full_extrapolated, code_full = plan()
    assert extrapolated and not full_extrapolated
    assert code_fast == code_full == step_full.gm.code
    _assert_same(step_fast, step_full)
    assert plan_fast["nodes"] == plan_full["nodes"]
    assert plan_fast["summary"]["total_us"] == plan_full["summary"]["total_us"]
