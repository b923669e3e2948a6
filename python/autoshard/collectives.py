"""``autoshard.collectives``: the public name of the collectives for ``local_map`` regions,
where AutoParallel users find them (``autoparallel.collectives``). They are defined with the
local_map op in ``autoshard.ops.local_map_collectives``."""

from autoshard.ops.local_map_collectives import (  # noqa: F401
    __all__,
    all_gather,
    all_reduce,
    all_to_all,
    axis_index,
    axis_size,
    grad_all_reduce,
    reduce_scatter,
)
