"""One pipeline stage of a Llama-style decoder as a module of its own: a range of the
model's layers, with the token embedding on the first stage and the final norm, output head
and loss on the last. The stage modules share the model's submodules (no copies), and name
their layers from 0, so that stages of alike layers trace alike graphs (and hit the same
cached plan); ``full_name`` maps a stage's parameter names back to the model's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoshard.models import Llama, LlamaConfig, rope_tables


class LlamaStage(nn.Module):
    """``forward(x)`` -> hidden states for every stage but the last (``x``: token ids on the
    first stage, hidden states on the others); the last stage's ``forward(x, labels)``
    returns the mean next-token cross-entropy, as ``Llama.forward`` does."""

    def __init__(
        self,
        cfg: LlamaConfig,
        layers: list[nn.Module],
        tok_embeddings: nn.Module | None = None,
        norm: nn.Module | None = None,
        output: nn.Module | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        if tok_embeddings is not None:
            self.tok_embeddings = tok_embeddings
        self.layers = nn.ModuleList(layers)
        if output is not None:
            self.norm = norm
            self.output = output

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        h = self.tok_embeddings(x) if hasattr(self, "tok_embeddings") else x
        b, s = h.shape[0], h.shape[1]
        cos, sin = rope_tables(
            self.cfg.dim // self.cfg.n_heads, s, self.cfg.rope_theta, device=h.device
        )
        for layer in self.layers:
            h = layer(h, cos, sin)
        if not hasattr(self, "output"):
            return h
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.reshape(b * s, -1).float(), labels.reshape(b * s))


@dataclass(frozen=True)
class StageModule:
    """A stage's module and where its layers sit in the model."""

    index: int
    layers: range
    module: LlamaStage
    is_first: bool
    is_last: bool

    def full_name(self, name: str) -> str:
        """The model's name of the stage's parameter ``name`` (layers renumbered back)."""
        if name.startswith("layers."):
            k, rest = name[len("layers.") :].split(".", 1)
            return f"layers.{self.layers.start + int(k)}.{rest}"
        return name


def split_model(model: nn.Module, ranges: list[range]) -> list[StageModule]:
    """The stage modules of ``model`` for the layer ``ranges`` (stage_split.py)."""
    if not isinstance(model, Llama):
        raise NotImplementedError(
            f"pipeline: stages of {type(model).__name__} cannot be built yet; supported: "
            "autoshard.models.Llama (token embedding, a `layers` ModuleList, final norm, "
            "output head, cross-entropy)"
        )
    n = len(ranges)
    stages = []
    for k, r in enumerate(ranges):
        first, last = k == 0, k == n - 1
        module = LlamaStage(
            model.cfg,
            [model.layers[i] for i in r],
            tok_embeddings=model.tok_embeddings if first else None,
            norm=model.norm if last else None,
            output=model.output if last else None,
        )
        stages.append(StageModule(k, r, module, first, last))
    return stages
