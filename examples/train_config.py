"""The trainer's configuration: defaults, a TOML file on top, command-line overrides last.

    torchrun --nproc_per_node 2 examples/train.py --config examples/llama_tiny.toml \
        --training.steps 40 --checkpoint.folder /tmp/ckpt

Every setting is SECTION.KEY; an override's value is read as the default's type (lists as
comma-separated values), and an unknown section or key is an error naming it.
"""

from __future__ import annotations

import copy
import tomllib

DEFAULTS: dict[str, dict] = {
    "model": {
        "dim": 64,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "vocab_size": 256,
        "ffn_dim": 128,
    },
    "training": {
        "steps": 20,
        "batch_size": 8,
        "seq_len": 32,
        "lr": 1e-3,
        "weight_decay": 0.0,
        "seed": 0,
    },
    # data.path: "" for synthetic tokens, else a local text file read as bytes (vocab >= 256)
    "data": {"path": ""},
    # parallel.mesh: [] for one dim over all ranks; dim_names must fit the preset.
    # parallel.cp > 1 adds a context-parallel mesh dim "cp" of that size (last): the sequence
    # split over it, in load-balanced head-tail order unless cp_load_balance is false
    # (training.seq_len must then divide by 2 x cp; docs/context_parallel.md).
    # parallel.pp > 1 trains a pipeline (docs/pipeline.md) on the mesh (pp, dp = ranks / pp),
    # 0 on the (pp, dp) the planner chooses: the model's layers cut into stages, each
    # planned by autoshard on its dp ranks;
    # pp_schedule "auto" | "GPipe" | "1F1B" | "Interleaved1F1B" and pp_microbatches (0: auto)
    # are chosen by pricing where left to the planner
    "parallel": {
        "preset": "fsdp",
        "mesh": [],
        "dim_names": ["dp"],
        "cp": 1,
        "cp_load_balance": True,
        "pp": 1,
        "pp_schedule": "auto",
        "pp_microbatches": 0,
        "plan_time_limit": 2.0,
        "hardware": "",
    },
    # checkpoint.interval: save every N steps (and after the last); 0 disables checkpoints
    "checkpoint": {"folder": "outputs/checkpoint", "interval": 10, "resume": True},
    # metrics.peak_flops: per rank, for MFU; 0 takes the planner's hardware profile
    "metrics": {"log_freq": 1, "peak_flops": 0.0},
}


class ConfigError(ValueError):
    pass


def _merge(base: dict, update: dict, where: str) -> None:
    for section, values in update.items():
        if section not in base:
            raise ConfigError(
                f"{where}: unknown section [{section}] (known: " f"{', '.join(base)})"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: [{section}] must be a table")
        for key, value in values.items():
            if key not in base[section]:
                raise ConfigError(
                    f"{where}: unknown setting {section}.{key} (known: "
                    f"{', '.join(base[section])})"
                )
            base[section][key] = _typed(value, base[section][key], f"{section}.{key}", where)


def _typed(value, default, name: str, where: str):
    """``value`` as the default's type; strings (command line) are parsed."""
    kind = type(default)
    try:
        if isinstance(value, str) and kind is not str:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            if kind is list:
                return [_item(v.strip()) for v in value.split(",") if v.strip()]
            return kind(value)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(value)
        return value
    except ValueError:
        raise ConfigError(f"{where}: {name} = {value!r} is not a {kind.__name__}") from None


def _item(text: str):
    return int(text) if text.lstrip("-").isdigit() else text


def load_config(argv: list[str]) -> dict:
    """Defaults, then ``--config FILE.toml``, then ``--section.key value`` overrides."""
    cfg = copy.deepcopy(DEFAULTS)
    overrides: dict[str, dict] = {}
    config_path = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"command line: unexpected argument {arg!r} (settings are " "--section.key value)"
            )
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise ConfigError(f"command line: {arg} needs a value")
            value = argv[i + 1]
            i += 1
        i += 1
        if key == "config":
            config_path = value
            continue
        section, dot, name = key.partition(".")
        if not dot:
            raise ConfigError(f"command line: {arg}: expected --config or --section.key")
        overrides.setdefault(section, {})[name] = value
    if config_path:
        with open(config_path, "rb") as f:
            _merge(cfg, tomllib.load(f), config_path)
    _merge(cfg, overrides, "command line")
    return cfg


CP_DIM = "cp"
PP_DIM = "pp"


def _pipeline_layout(parallel: dict, world: int) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    pp = parallel["pp"]
    if parallel["cp"] > 1 or parallel["mesh"]:
        raise ConfigError(
            f"parallel.pp = {pp} with parallel.cp or parallel.mesh: a pipeline's mesh is "
            "(pp, dp = ranks / pp); stage meshes of more dims are not supported yet"
        )
    if pp == 0:  # the planner chooses (pp, dp)
        return None, (PP_DIM, "dp")
    if world % pp:
        raise ConfigError(f"parallel.pp = {pp} does not divide the {world} ranks")
    return (pp, world // pp), (PP_DIM, "dp")


def mesh_layout(
    parallel: dict, world: int
) -> tuple[tuple[int, ...] | None, tuple[str, ...] | None]:
    """The mesh shape and dim names of the ``parallel`` settings on ``world`` ranks:
    ``mesh`` (or one dim over all ranks) with ``dim_names``, and with ``cp`` > 1 a last dim
    "cp" of that size taken out of the ranks (``mesh``, when given, is the other dims); with
    ``pp`` > 1 the pipeline's (pp, dp); with ``pp`` 0 None for the shape (the planner
    chooses the pipeline's)."""
    cp, names = parallel["cp"], tuple(parallel["dim_names"])
    if parallel["pp"] < 0:
        raise ConfigError(
            f"parallel.pp = {parallel['pp']}: the pipeline size must be >= 1 (0: chosen)"
        )
    if parallel["pp"] != 1:
        return _pipeline_layout(parallel, world)
    if cp < 1:
        raise ConfigError(f"parallel.cp = {cp}: the context-parallel size must be >= 1")
    if CP_DIM in names:
        raise ConfigError(
            f"parallel.dim_names {list(names)} names a {CP_DIM!r} dim; set its size with "
            "parallel.cp instead"
        )
    if cp == 1:
        shape = tuple(parallel["mesh"]) or (world,)
    else:
        if world % cp:
            raise ConfigError(f"parallel.cp = {cp} does not divide the {world} ranks")
        shape = (tuple(parallel["mesh"]) or (world // cp,)) + (cp,)
        names = (names or ("dp",))[: len(shape) - 1] + (CP_DIM,)
    if len(shape) and names and len(names) != len(shape):
        raise ConfigError(
            f"parallel.dim_names {list(names)} do not name the {len(shape)} dims of mesh "
            f"{list(shape)}"
        )
    return shape, names or None
