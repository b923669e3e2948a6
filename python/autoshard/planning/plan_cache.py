"""Plans cached on disk: planning the same traced graph on the same mesh with the same
constraints, hardware and planner options again returns the stored plan instead of solving.

    cache = PlanCache.resolve(setting)     # None when caching is off
    key = plan_key(graph_json, options)
    plan = cache.load(key)                 # None on a miss (an unreadable entry warns)
    cache.store(key, plan)

The key is the SHA-256 of the graph JSON, the planner options (mesh, hardware, input /
output / node constraints, parameter memory, memory limit, time limit, gap tolerance), this
package's version, a digest of the C++ extension (a rebuilt planner never reuses older
plans) and the entry format. One JSON file per key in the cache folder: the ``plan_cache``
argument of AutoParallel / auto_parallel (a path), else ``$AUTOSHARD_CACHE_DIR``, else
``$XDG_CACHE_HOME/autoshard/plans`` (``~/.cache/autoshard/plans``); ``plan_cache=False``
turns it off. Writes go through a temporary file and a rename, so readers never see half an
entry; an entry that does not parse or does not match its key is ignored with a warning and
replaced by the next plan.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger("autoshard")

FORMAT_VERSION = 1
ENV_DIR = "AUTOSHARD_CACHE_DIR"


def default_directory() -> Path:
    """``$AUTOSHARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/autoshard/plans``, else
    ``~/.cache/autoshard/plans``."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoshard" / "plans"


@functools.lru_cache(maxsize=1)
def core_fingerprint() -> str:
    """A digest of the C++ extension's file: plans from another build of the planner (other
    cost model, other solver) are never reused."""
    from autoshard import _core

    path = getattr(_core, "__file__", None)
    if not path:
        return "unknown"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return "unknown"
    return h.hexdigest()


def plan_key(graph_json: str, options: dict) -> str:
    """The cache key of planning ``graph_json`` with the planner ``options`` (the options
    JSON of docs/formats.md; ``verbose`` does not change the plan and is left out)."""
    from autoshard import __version__

    payload = {
        "format": FORMAT_VERSION,
        "autoshard": __version__,
        "core": core_fingerprint(),
        "graph": hashlib.sha256(graph_json.encode()).hexdigest(),
        "options": {k: v for k, v in options.items() if k != "verbose"},
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def plan_digest(plan: dict) -> str:
    """A digest of a plan's content, for comparing the plans ranks loaded."""
    text = json.dumps(plan, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class PlanCache:
    """One folder of cached plans (created on the first store)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory).expanduser()

    @classmethod
    def resolve(cls, setting: Any = True) -> "PlanCache | None":
        """``True`` or None: the default folder (default_directory); ``False``: no cache;
        a path: that folder."""
        if setting is False:
            return None
        if setting is True or setting is None:
            return cls(default_directory())
        if isinstance(setting, (str, os.PathLike)):
            if not str(setting):
                raise ValueError(
                    "plan_cache: an empty path; pass a folder, True for the "
                    "default folder, or False for no cache"
                )
            return cls(setting)
        raise TypeError(
            f"plan_cache must be True, False or a folder path, got "
            f"{type(setting).__name__} {setting!r}"
        )

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict | None:
        """The stored plan of ``key``, or None on a miss. An entry that cannot be read, does
        not parse or belongs to another key or format is ignored with a warning."""
        path = self.path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):  # a miss (no folder yet counts as one)
            return None
        except OSError as e:
            warnings.warn(
                f"autoshard: cannot read the plan cache entry {path} ({e}); planning " "again",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        try:
            entry = json.loads(text)
            if not isinstance(entry, dict):
                raise ValueError("not a JSON object")
            if entry.get("format") != FORMAT_VERSION:
                raise ValueError(f"format {entry.get('format')!r}, expected {FORMAT_VERSION}")
            if entry.get("key") != key:
                raise ValueError("it was stored under another key")
            plan = entry.get("plan")
            if not isinstance(plan, dict) or not isinstance(plan.get("nodes"), dict):
                raise ValueError("no plan in it")
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            warnings.warn(
                f"autoshard: ignoring the corrupt plan cache entry {path} ({e}); "
                "planning again (the new plan replaces it)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        return plan

    def store(self, key: str, plan: dict) -> Path | None:
        """Writes ``plan`` under ``key`` (atomically); a folder that cannot be written warns
        and returns None, planning itself never fails on the cache."""
        path = self.path(key)
        entry = {
            "format": FORMAT_VERSION,
            "key": key,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "plan": plan,
        }
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(entry, f)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except (OSError, TypeError, ValueError) as e:
            warnings.warn(
                f"autoshard: cannot store the plan in the cache folder "
                f"{self.directory} ({e}); the plan is used but not cached",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        return path


def cached_plan(cache: PlanCache | None, key: str | None, make_plan) -> dict:
    """``make_plan()``, or the plan stored under ``key`` when there is one (logged as a hit;
    the returned plan carries ``plan_cache: {"key", "hit"}``). A new plan is stored."""
    if cache is None or key is None:
        return make_plan()
    plan = cache.load(key)
    if plan is not None:
        log.info("autoshard: plan cache hit (key %s, %s)", key[:16], cache.path(key))
        plan["plan_cache"] = {"key": key, "hit": True}
        return plan
    log.info("autoshard: plan cache miss (key %s): planning", key[:16])
    plan = make_plan()
    plan.pop("plan_cache", None)
    cache.store(key, plan)
    plan["plan_cache"] = {"key": key, "hit": False}
    return plan
