"""autoshard: automatic parallelization planner for PyTorch training, with a C++ core.

The public API follows meta-pytorch/autoparallel: ``AutoParallel`` (context manager) and
``auto_parallel`` (one call). Everything that computes (strategies, costs, search, reports)
lives in the C++ extension ``autoshard._core``; this package only touches live torch objects.
"""

__version__ = "0.1.0"

from . import _core  # noqa: F401  (fail early if the extension is missing)

try:  # the torch-facing API is optional so `autoshard solve` works without torch
    from .api import AutoParallel, auto_parallel  # noqa: F401
    from .apply import load_full_state_dict, local_inputs  # noqa: F401
    from .trace import ForwardInputs  # noqa: F401
except ImportError as _e:  # pragma: no cover
    if "torch" not in str(_e) and "api" not in str(_e):
        raise
