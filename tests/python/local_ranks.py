"""Helpers for running a lowered program for several ranks at once under torch's
LocalTensorMode (tests of compile_on_one_rank programs)."""

import torch
import torch.distributed.config as dist_config
from torch.distributed._local_tensor import LocalTensor
from torch.distributed.tensor import distribute_tensor

from autoshard import AutoParallel


def one_program(model_cls, input_fn, mesh, inputs, outputs=None, param_share=None):
    """``model_cls`` planned on ``mesh`` (input layouts ``inputs``, optional output layouts
    and parameter share) and lowered once for every rank (compile_on_one_rank). Returns
    (the AutoParallel, its parallel_gm, the layouts of the primal placeholders in order:
    parameters, buffers, inputs)."""
    with torch.device("meta"):
        meta = model_cls()
    with dist_config.patch(compile_on_one_rank=True):
        with AutoParallel(meta, input_fn, mesh) as autop:
            autop.add_input_constraints(inputs)
            if outputs is not None:
                autop.add_output_constraints(outputs)
            if param_share is not None:
                autop.add_parameter_memory_constraint(*param_share)
            placement = autop.optimize_placement()
            autop.apply_placement(placement)
            joint = autop.parallel_gm
    step = autop.step
    n_primals = len(step.param_fqns) + len(step.buffer_fqns)
    n_primals += sum(name is not None for name in step.input_nodes)
    primals = [n for n in step.gm.graph.nodes if n.op == "placeholder"][:n_primals]
    return autop, joint, [tuple(placement[n].output_specs.placements) for n in primals]


def per_rank(t: torch.Tensor, world: int) -> LocalTensor:
    """``t`` as a LocalTensor with one copy per rank: a replicated value comes out of
    ``distribute_tensor(...).to_local()`` as one plain tensor, which an in-place write or a
    rank-dependent op would treat as shared."""
    if isinstance(t, LocalTensor):
        return t
    return LocalTensor({r: t.clone() for r in range(world)})


def shards(values, layouts, mesh) -> list:
    """Each full value's shards on every rank (call under LocalTensorMode), in ``layouts``."""
    return [
        per_rank(distribute_tensor(v, mesh, lay).to_local(), mesh.size())
        for v, lay in zip(values, layouts)
    ]
