"""The eager backward frees each input after its last use, and an input it never reads
before it starts (program/execution.py _run_backward): an unread input bound to a local
of the boxed graph would keep its storage (often shared with a saved tensor that is read)
alive until the backward returns."""

import weakref

import torch
import torch.fx as fx

from autoshard.program.execution import _run_backward, unread_inputs
from autoshard.program.local_program import LocalProgram


def _backward_graph() -> fx.GraphModule:
    """(a, unread, b) -> (a * 2, b + 1), with a hook that records which inputs are alive
    when the second op runs."""
    g = fx.Graph()
    a = g.placeholder("a")
    g.placeholder("unread")
    b = g.placeholder("b")
    doubled = g.call_function(torch.mul, (a, 2))
    probe = g.call_function(_record_alive, (doubled,))
    g.output((probe, g.call_function(torch.add, (b, 1))))
    return fx.GraphModule(torch.nn.Module(), g)


_watched: list = []
_alive_midway: list = []


def _record_alive(x):
    _alive_midway.append([ref() is not None for ref in _watched])
    return x


def test_unread_inputs_are_found():
    assert unread_inputs(_backward_graph()) == (1,)


def test_an_unread_input_is_freed_before_the_backward_runs():
    gm = _backward_graph()
    program = LocalProgram(
        fwd_gm=gm, bwd_gm=gm, n_outputs=0, output_slots=[], input_tensor_positions=[], run_bwd_gm=gm
    )
    program.bwd = gm
    a, unread, b = torch.ones(4), torch.ones(1 << 16), torch.ones(4)
    _watched[:] = [weakref.ref(a), weakref.ref(unread)]
    args = [a, unread, b]
    del a, unread
    out = _run_backward(program, args)
    # a was read by the first op (freed after it), the unread input freed up front
    assert _alive_midway[-1] == [False, False]
    assert torch.equal(out[0], torch.full((4,), 2.0)) and torch.equal(out[1], torch.full((4,), 2.0))
