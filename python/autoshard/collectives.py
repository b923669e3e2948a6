"""``autoshard.collectives``: the public name of ``local_map`` and of the collectives for
its regions, where AutoParallel users find them (``from autoparallel.collectives import
local_map, axis_size, ...``). They are defined in ``autoshard.ops.local_map`` and
``autoshard.ops.local_map_collectives``."""

from autoshard.ops.local_map import local_map  # noqa: F401
from autoshard.ops.local_map_collectives import (  # noqa: F401
    __all__ as _collectives,
    all_gather,
    all_reduce,
    all_to_all,
    axis_index,
    axis_size,
    grad_all_reduce,
    reduce_scatter,
)

__all__ = [*_collectives, "local_map"]
