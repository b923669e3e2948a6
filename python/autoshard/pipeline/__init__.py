"""Pipeline parallelism on torch's own pipelining library: a model's layer stack cut into
stages (stage_split.py, stage_modules.py), each stage planned by autoshard on its
data-parallel ranks and wrapped as torch's ``PipelineStage`` (stage_runtime.py), driven by
torch's schedules (pipeline.py); the mesh, schedule and microbatches a user leaves out are
chosen by pricing the candidates (search.py, choice.py). docs/pipeline.md."""

from autoshard.pipeline.choice import choose_pipeline
from autoshard.pipeline.pipeline import Pipeline, plan_pipeline
from autoshard.pipeline.search import PipelineSearch, PricedCandidate, StageProfile

__all__ = [
    "Pipeline",
    "PipelineSearch",
    "PricedCandidate",
    "StageProfile",
    "choose_pipeline",
    "plan_pipeline",
]
