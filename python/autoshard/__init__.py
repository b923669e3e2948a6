"""autoshard: automatic parallelization planner for PyTorch training, with a C++ core.

The public API follows meta-pytorch/autoparallel: ``AutoParallel`` (context manager) and
``auto_parallel`` (one call). Everything that computes (strategies, costs, search, reports)
lives in the C++ extension ``autoshard._core``; this package only touches live torch objects.
"""

__version__ = "0.1.0"

from . import _core  # noqa: F401  (fail early if the extension is missing)

# The torch-facing names are imported on first use: importing torch takes seconds, and the
# `autoshard solve` / `autoshard plan` commands do not need it.
_LAZY = {
    "AutoParallel": "api.autoparallel",
    "auto_parallel": "api.autoparallel",
    "load_full_state_dict": "runtime.module_state",
    "local_inputs": "runtime.module_state",
    "ForwardInputs": "trace.traced_step",
    "autoparallel_backend": "api.keywords",
    "with_sharding_constraint": "ops.sharding_constraint",
    "register_sharding": "ops.user_rules",
    "local_map": "ops.local_map",
    "dense_flex_attention_on_cpu": "ops.flex_attention",
    "document_head_tail_order": "trace.load_balance",
    "varlen_attention_on_cpu": "ops.varlen_attention",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    import importlib

    if name == "collectives":  # a public submodule, readable as an attribute as well
        value = importlib.import_module(".collectives", __name__)
        globals()[name] = value
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autoshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
