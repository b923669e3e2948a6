"""Pipeline parallelism on torch's own pipelining library: a model's layer stack cut into
stages (stage_split.py, stage_modules.py), each stage planned by autoshard on its
data-parallel ranks and wrapped as torch's ``PipelineStage`` (stage_runtime.py), driven by
torch's schedules (pipeline.py). docs/pipeline.md."""

from autoshard.pipeline.pipeline import Pipeline, plan_pipeline

__all__ = ["Pipeline", "plan_pipeline"]
