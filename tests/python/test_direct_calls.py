"""direct_calls.py: every binding gives what its overload gives (values, dtype, shape,
strides, aliasing) on sample arguments, and a rewritten graph computes the same."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autoshard.program.passes.direct_calls import DIRECT, bind_direct_calls

aten = torch.ops.aten


def _samples():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g)
    m = torch.randn(3, 5, generator=g)
    b = torch.randn(2, 4, 5, generator=g)
    return {
        aten.view.default: [(x, [6, 4])],
        aten.reshape.default: [(x.transpose(0, 1), [3, 8])],
        aten.expand.default: [(torch.randn(1, 3, generator=g), [4, 3])],
        aten.t.default: [(m,)],
        aten.transpose.int: [(x, 0, 2)],
        aten.permute.default: [(x, [2, 0, 1])],
        aten.unsqueeze.default: [(x, 1)],
        aten.squeeze.dims: [(torch.randn(2, 1, 3, 1, generator=g), [1, 3])],
        aten.unbind.int: [(x, 1)],
        aten.split_with_sizes.default: [(x, [1, 3], 2)],
        aten.cat.default: [([x, x], 1)],
        aten.stack.default: [([m, m], 0)],
        aten.clone.default: [(x.transpose(0, 2),)],
        aten.mm.default: [(m.t(), m)],
        aten.bmm.default: [(b, b.transpose(1, 2))],
        aten.add.Tensor: [(x, x[0]), (x, 2.5)],
        aten.sub.Tensor: [(x, x[1])],
        aten.mul.Tensor: [(x, x), (x, 3)],
        aten.mul.Scalar: [(x, 0.5)],
        aten.div.Tensor: [(x, torch.tensor(3.0))],
        aten.div.Scalar: [(x, 128)],
        aten.sum.default: [(x,)],
        aten.sum.dim_IntList: [(x, [1], True), (x, [0, 2])],
        aten.mean.dim: [(x, [-1], True)],
        aten.pow.Tensor_Scalar: [(x, 2), (x, 1)],
        aten.rsqrt.default: [(x.abs() + 1,)],
        aten.neg.default: [(x,)],
        aten.embedding.default: [(m, torch.tensor([[0, 2], [1, 1]]))],
        aten.silu.default: [(x,)],
    }


SAMPLES = _samples()


def _aliases(out: torch.Tensor, arg) -> bool:
    return (
        isinstance(arg, torch.Tensor)
        and out.untyped_storage().data_ptr() == arg.untyped_storage().data_ptr()
    )


def test_every_binding_has_samples():
    assert set(SAMPLES) == set(DIRECT)


@pytest.mark.parametrize("op", list(SAMPLES), ids=str)
def test_binding_gives_what_its_overload_gives(op):
    for args in SAMPLES[op]:
        want, got = op(*args), DIRECT[op](*args)
        wants = want if isinstance(want, (tuple, list)) else [want]
        gots = got if isinstance(got, (tuple, list)) else [got]
        assert len(gots) == len(wants)
        for w, g in zip(wants, gots):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g, w, rtol=0, atol=0)
            assert _aliases(g, args[0]) == _aliases(w, args[0])  # a view stays a view


def test_a_rewritten_graph_computes_the_same():
    def f(x, w):
        h = torch.nn.functional.silu(x @ w).view(2, 4, 5)
        return (h.transpose(1, 2).sum([0]) * 0.5 + 1, h.expand(3, 2, 4, 5).clone())

    x, w = torch.randn(8, 3), torch.randn(3, 5)
    gm = make_fx(f)(x, w)
    expected = gm(x, w)
    assert bind_direct_calls(gm) >= 5
    assert "torch.ops.aten" not in gm.code.split("def forward")[1].replace("_unsafe_view", "")
    for a, b in zip(gm(x, w), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
