"""Which frame of a stack is the user's model, for the source lines in messages and plans.

A traced node's stack runs from torch's export entry point through the user's model into
library helpers (torch.nn.functional, transformers' attention, loss and MoE integrations) down
to the call that dispatched the op. The line worth showing is the innermost one in the
model's own code:
  rank 0 - the model: any file outside torch, autoshard and transformers' helpers, and
           transformers' ``models/<name>/modeling_<name>.py`` (a Hugging Face model's code);
  rank 1 - helpers: the rest of transformers (``integrations/``, ``loss/``, ``masking_utils``,
           ...) and autoshard's own files (its wrappers, and its example models when nothing
           else is there);
  rank 2 - torch itself (``torch/nn/functional.py``, ``torch/_dynamo/functional_export.py``):
           never shown.
The innermost frame of the lowest rank present wins; a stack of torch frames only has none.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Iterable, NamedTuple

import torch
import torch.fx as fx

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# the package's root folder: a frame in any of its files is autoshard's own
AUTOSHARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TRANSFORMERS = re.compile(r"[/\\]transformers[/\\]")
_HF_MODELING = re.compile(r"[/\\]transformers[/\\]models[/\\][^/\\]+[/\\]modeling_[^/\\]+\.py$")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


class Frame(NamedTuple):
    filename: str
    lineno: int
    name: str
    code: str


def frame_rank(filename: str) -> int:
    """0: the user's model, 1: a library helper (transformers, autoshard), 2: torch."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_TORCH_DIR):
        return 2
    if _TRANSFORMERS.search(path):
        return 0 if _HF_MODELING.search(path) else 1
    if path.startswith(AUTOSHARD_DIR):
        return 1
    return 0


def user_frame(frames: Iterable[Frame]) -> Frame | None:
    """The innermost frame of the lowest rank (``frames`` outermost first); None when every
    frame is torch's."""
    best: Frame | None = None
    best_rank = 2
    for f in frames:  # later (inner) frames of the same rank replace earlier ones
        r = frame_rank(f.filename)
        if r < 2 and r <= best_rank:
            best, best_rank = f, r
    return best


def parse_stack_trace(trace: str | None) -> list[Frame]:
    """The frames of an fx node's ``stack_trace`` text, outermost first."""
    lines = (trace or "").rstrip().splitlines()
    frames = []
    for i, line in enumerate(lines):
        m = _FILE_LINE.search(line)
        if not m:
            continue
        code = ""
        if i + 1 < len(lines) and not _FILE_LINE.search(lines[i + 1]):
            code = lines[i + 1].strip()
        frames.append(Frame(m.group(1), int(m.group(2)), m.group(3), code))
    return frames


@functools.lru_cache(maxsize=4096)
def user_frame_of_trace(trace: str | None) -> Frame | None:
    """``user_frame(parse_stack_trace(trace))``, remembered per trace text: a graph has few
    distinct traces (every layer of a repeated block runs the same lines, and backward nodes
    carry their forward node's trace), so most nodes need no parsing."""
    return user_frame(parse_stack_trace(trace))


def source_line(node: fx.Node) -> str | None:
    """``model.py:42 in forward: y = self.w1(x)`` from the node's stack trace: the innermost
    frame of the user's model, not of torch or of library helpers (user_frames.py: the line
    in ``modeling_llama.py`` that calls the loss, not the ``F.pad`` inside transformers' loss
    helper, nor torch's export wrapper)."""
    frame = user_frame_of_trace(node.meta.get("stack_trace"))
    if frame is None:
        return None
    where = f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return f"{where}: {frame.code}" if frame.code else where


def module_path(node: fx.Node) -> str | None:
    """The innermost module path (``layers.0.attention.wq``) from nn_module_stack (forward
    nodes) or fwd_nn_module_stack (backward nodes)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    return dotted_module_path(list(stack.values())[-1][0])


@functools.lru_cache(maxsize=4096)
def dotted_module_path(path: str) -> str | None:
    """``L['self'].layers[0]._modules['wq']`` -> ``layers.0.wq``; remembered, since the
    nodes of one module (forward and backward) share its path. Dynamo also spells a child
    ``getattr(L['self'].inner.layers, '0')`` (a module under a wrapper such as the mixed
    precision CastingStep)."""
    while True:
        unwrapped = re.sub(r"getattr\(([^(),]*), '([^']+)'\)", r"\1.\2", path)
        if unwrapped == path:
            break
        path = unwrapped
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']+)'\]", r".\1", path)
    return path.lstrip(".") or None
