"""What tests, benchmarks and tools use, kept apart from the product (tracing, planning,
the lowered program and its runtime, the API): the numeric rule validator (``validate``,
with its targeted graphs in ``op_cases``), the hand-written Megatron / FSDP / DDP baselines
(``baselines``) and the test models (``models``: a Llama-style decoder, also the demo's;
``models_zoo``; ``hf_zoo``: tiny Hugging Face families). Nothing in the product imports
this package except the demo, which plans ``models.Llama``."""
