"""Binding a call of the parallel module to the inputs of the traced step, by NAME.

The traced step numbers its inputs by flattening the traced call ``(args, kwargs)``. A later
call may spell the same inputs differently: keywords in another order, a positional argument
passed by keyword, a dict built in another key order. Flattening that call as it comes would
hand tensors to the wrong graph inputs without an error whenever their shapes agree. So
every call is bound through the original ``forward``'s signature: each traced argument is
looked up by its parameter name, and its structure is flattened against the traced one
(dicts by key), so any spelling gives the same flat inputs, and a different structure is an
error naming the argument.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

_EMPTY = inspect.Parameter.empty


class InputArgumentsError(ValueError, TypeError):
    """A call's arguments differ in number or names from the traced call's. A ValueError,
    which AutoParallel raises for a wrong argument count, and a TypeError, Python's type for
    a call that does not bind: a handler written for either catches it."""


@dataclass(frozen=True)
class _Slot:
    """One argument of the traced call: where a call holds it, and where its leaves go."""

    kind: str  # "param" (a named parameter), "varpos" (*args element), "varkw" (**kwargs key)
    key: Any  # parameter name, *args index or **kwargs key
    label: str  # how errors name it: "x", "args[2]", "kwargs['mask']"
    spec: Any  # pytree spec of the traced value
    positions: tuple  # the value's leaves' indices among the traced flat inputs


def forward_signature(model) -> inspect.Signature | None:
    """``model.forward``'s signature (without self); None where Python cannot read one."""
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


class InputBinder:
    """Maps ``(args, kwargs)`` of a call to the traced step's flat inputs."""

    def __init__(self, signature: inspect.Signature | None, input_spec: Any, n_inputs: int):
        self.signature = signature
        self.input_spec = input_spec
        self.n_inputs = n_inputs
        self.slots: list[_Slot] | None = None
        if signature is not None:
            try:
                self.slots = self._traced_slots()
            except TypeError:  # the traced call itself does not bind: keep flat order
                self.slots = None

    # ---- what the traced call looked like --------------------------------------------------
    def _traced_slots(self) -> list[_Slot]:
        # the traced call with each argument replaced by its spec and leaf positions (read
        # off the spec: unflattening indices would construct the argument's classes from
        # ints, which a class such as BlockMask refuses)
        args, kwargs = _traced_arguments(self.input_spec)
        bound = self.signature.bind(*args, **kwargs)
        params = self.signature.parameters
        slots = []

        def add(kind, key, label, value: _TracedArgument):
            slots.append(_Slot(kind, key, label, value.spec, value.positions))

        for name, value in bound.arguments.items():
            kind = params[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                for i, v in enumerate(value):
                    add("varpos", i, f"{name}[{i}]", v)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                for k, v in value.items():
                    add("varkw", k, f"{name}[{k!r}]", v)
            else:
                add("param", name, name, value)
        return slots

    def labels(self) -> list[str]:
        """A readable name per flat input: ``x``, ``batch['mask']``, ``args[0]``."""
        if getattr(self, "_labels", None) is None:
            self._labels = self._make_labels()
        return self._labels

    def _make_labels(self) -> list[str]:
        out = [f"input {i}" for i in range(self.n_inputs)]
        if self.slots is None:
            return out
        for slot in self.slots:
            for k, (path, pos) in enumerate(_leaf_paths(slot)):
                out[pos] = slot.label + (pytree.keystr(path) if path is not None else f"[{k}]")
        return out

    # ---- a call -------------------------------------------------------------------------------
    def flatten(self, args: tuple, kwargs: dict) -> list:
        """The flat inputs of a call, in the traced order. Raises TypeError / ValueError
        naming the argument whose presence or structure differs from the traced call."""
        if self.slots is None:
            flat, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
            return flat
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InputArgumentsError(
                f"autoshard: the parallel module's forward{self.signature}: {e}; "
                f"{self._traced_arguments()}"
            ) from None
        params = self.signature.parameters
        flat: list = [None] * self.n_inputs
        used: set = set()
        for slot in self.slots:
            value = self._lookup(bound, slot)
            used.add((slot.kind, slot.key))
            try:
                leaves = slot.spec.flatten_up_to(value)
            except (ValueError, TypeError) as e:
                raise ValueError(
                    f"autoshard: argument '{slot.label}' does not have the structure it was "
                    f"traced with ({_describe(slot.spec)}): {e} Pass it as traced, or trace "
                    "the model with this structure"
                ) from None
            for pos, leaf in zip(slot.positions, leaves):
                flat[pos] = leaf
        for name, value in bound.arguments.items():
            kind = params[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                extra = [f"{name}[{i}]" for i in range(len(value)) if ("varpos", i) not in used]
            elif kind is inspect.Parameter.VAR_KEYWORD:
                extra = [f"{name}[{k!r}]" for k in value if ("varkw", k) not in used]
            else:
                extra = (
                    [name]
                    if ("param", name) not in used and not _is_default(value, params[name].default)
                    else []
                )
            if extra:
                raise InputArgumentsError(
                    f"autoshard: argument(s) {', '.join(extra)} were not given "
                    "when the model was traced, so the planned step has no input "
                    "for them: leave them out, or trace with them (input_fn / "
                    f"sample_inputs); {self._traced_arguments()}"
                )
        return flat

    def _lookup(self, bound: inspect.BoundArguments, slot: _Slot) -> Any:
        if slot.kind == "param":
            if slot.key in bound.arguments:
                return bound.arguments[slot.key]
            default = self.signature.parameters[slot.key].default
            if default is _EMPTY:  # bind() already refused a missing required argument
                raise InputArgumentsError(
                    f"autoshard: missing argument '{slot.key}'; {self._traced_arguments()}"
                )
            return default  # traced with a value, called without: the checks compare them
        var = next(
            (
                n
                for n, p in self.signature.parameters.items()
                if p.kind
                is (
                    inspect.Parameter.VAR_POSITIONAL
                    if slot.kind == "varpos"
                    else inspect.Parameter.VAR_KEYWORD
                )
            ),
            None,
        )
        container = bound.arguments.get(var, () if slot.kind == "varpos" else {})
        try:
            return container[slot.key]
        except (IndexError, KeyError):
            raise InputArgumentsError(
                f"autoshard: missing argument '{slot.label}' (it was given when "
                f"the model was traced); {self._traced_arguments()}"
            ) from None

    def _traced_arguments(self) -> str:
        """How many arguments the traced call had, and which (errors name the count)."""
        names = [s.label for s in self.slots]
        return f"expected the {len(names)} argument(s) it was traced with: {', '.join(names)}"


@dataclass(frozen=True)
class _TracedArgument:
    """One argument of the traced call, as the flat inputs hold it."""

    spec: Any
    positions: tuple


def _traced_arguments(input_spec: Any) -> tuple[list, dict]:
    """The traced ``(args, kwargs)`` with each argument a _TracedArgument."""
    args_spec, kwargs_spec = input_spec.children()
    start = 0

    def take(spec) -> _TracedArgument:
        nonlocal start
        arg = _TracedArgument(spec, tuple(range(start, start + spec.num_leaves)))
        start += spec.num_leaves
        return arg

    args = [take(spec) for spec in args_spec.children()]
    kwargs = {key: take(spec) for key, spec in zip(kwargs_spec.context, kwargs_spec.children())}
    return args, kwargs


def _leaf_paths(slot: _Slot) -> list:
    """(key path or None, flat position) per leaf of ``slot``: the paths of an argument
    rebuilt from its positions, where its classes accept ints as leaves (None elsewhere)."""
    try:
        index_tree = pytree.tree_unflatten(list(slot.positions), slot.spec)
        return [(path, pos) for path, pos in pytree.tree_flatten_with_path(index_tree)[0]]
    except Exception:  # e.g. BlockMask, whose constructor checks its tensors
        return [(None, pos) for pos in slot.positions]


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is the parameter's default (an argument left out of the traced call may be
    passed with it). A tensor never counts: comparing its values would copy a result from
    the device to the host (a sync) on every call, and the traced step has no input for it
    anyway; other values compare by ``==``."""
    if default is _EMPTY:
        return False
    if value is default:
        return True
    if any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves((value, default))):
        return False
    try:
        return bool(value == default)
    except Exception:  # values without a plain truth value
        return False


def _describe(spec) -> str:
    if spec.is_leaf():
        return "one value"
    if spec.type is dict:
        return f"a dict with keys {list(spec.context)}"
    return f"a {spec.type.__name__} of {spec.num_children}"
