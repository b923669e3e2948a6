"""The pipeline choice on paper (autoshard.pipeline.search and choice; no torchrun): on a toy
cost table the chosen mesh, schedule, stages per rank and microbatch count are the minimum
of a brute force over every option priced with ``_core.price_pipeline`` directly; the
memory limit is honoured; fixed choices stay fixed; bad input gets a clear error."""

import math

import pytest
import torch

from autoshard import _core
from autoshard.models import Llama, LlamaConfig
from autoshard.pipeline import plan_pipeline
from autoshard.pipeline.choice import choose_pipeline
from autoshard.pipeline.search import StageProfile

BATCH, SEQ, LAYERS = 16, 8, 8


def _model(n_layers=LAYERS):
    cfg = LlamaConfig(dim=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, vocab_size=64)
    with torch.device("meta"):
        return Llama(cfg)


def _sample(batch=BATCH):
    return tuple(torch.empty(batch, SEQ, dtype=torch.long, device="meta") for _ in range(2))


# one sequence: a layer 100 us forward, 200 us backward; a head worth a layer on the last
# stage; per-layer activations of 1 MB; no parameters (no data-parallel traffic)
TOY = StageProfile(
    tp=1,
    layer_f_us=100.0,
    layer_b_us=200.0,
    layer_saved=10**6,
    layer_params=0,
    first_f_us=0.0,
    first_b_us=0.0,
    last_f_us=100.0,
    last_b_us=200.0,
    extra_saved=0,
    extra_params=0,
    layer_input_bytes=10**4,
)


def _brute_force(world, memory_limit=math.inf, hardware="CPU"):
    """(step, pp, schedule, v, m) of every option torch runs, priced directly."""
    out = []
    for pp in (p for p in range(2, world + 1) if world % p == 0 and p <= LAYERS):
        dp = world // pp
        per_rank = BATCH // dp
        for m in (m for m in range(1, per_rank + 1) if per_rank % m == 0):
            k = per_rank // m  # sequences per microbatch
            options = [("1F1B", 1)] if m >= pp else []
            if m >= pp and m % pp == 0:
                options += [("Interleaved1F1B", v) for v in range(2, 9) if pp * v <= LAYERS]
            for sched, v in options:
                n = pp * v
                f, b = k * TOY.layer_f_us, k * TOY.layer_b_us
                starts = list(_core.balanced_split([f + b] * LAYERS, n, 0.0, k * 300.0))
                bounds = starts + [LAYERS]
                stages = []
                # an empty all-gather and reduce-scatter per microbatch where dp > 1
                dp_us = 0.0
                if dp > 1:
                    mesh = [pp, dp, 1]
                    dp_us = _core.collective_time_us("reduce_scatter", 0.0, hardware, mesh, 1)
                    dp_us += _core.collective_time_us("all_gather", 0.0, hardware, mesh, 1)
                for s in range(n):
                    layers = bounds[s + 1] - bounds[s]
                    last = s == n - 1
                    stages.append(
                        dict(
                            forward_us=layers * f + (k * 100.0 if last else 0) + dp_us / 3,
                            backward_us=layers * b + (k * 200.0 if last else 0) + 2 * dp_us / 3,
                            saved_bytes=layers * k * TOY.layer_saved,
                            resident_bytes=0,
                            send_bytes=k * TOY.layer_input_bytes,
                        )
                    )
                link = _core.mesh_dim_links(hardware, [pp, dp, 1])[0]
                est = _core.price_pipeline(
                    sched, pp, m, stages, link["bandwidth"], link["latency_us"], []
                )
                if max(est["rank_peak_bytes"]) <= memory_limit:
                    out.append((est["step_us"], pp, sched, v, m))
    return out


def _chosen(found):
    c = found.chosen.candidate
    return found.chosen.step_us, c.pp, c.schedule, c.virtual, c.microbatches


@pytest.mark.parametrize("world", [4, 8])
def test_choice_is_the_brute_force_minimum(world):
    found = choose_pipeline(_model(), _sample(), world_size=world, hardware="CPU", profile=TOY)
    options = _brute_force(world)
    assert len(found.priced) == len(options)
    best = min(options, key=lambda o: o[0])
    assert _chosen(found)[1:] == best[1:]
    assert math.isclose(_chosen(found)[0], best[0])
    assert "chosen" in found.report()


def test_choice_honours_the_memory_limit():
    free = choose_pipeline(_model(), _sample(), world_size=4, hardware="CPU", profile=TOY)
    # a limit just under the unconstrained choice's peak forces another choice
    limit = free.chosen.peak_bytes - 1
    found = choose_pipeline(
        _model(),
        _sample(),
        world_size=4,
        hardware="CPU",
        profile=TOY,
        memory_limit_bytes=limit,
    )
    assert found.chosen.peak_bytes <= limit
    best = min(_brute_force(4, memory_limit=limit), key=lambda o: o[0])
    assert _chosen(found)[1:] == best[1:]
    assert any(not p.fits for p in found.priced)
    with pytest.raises(ValueError, match="no candidate fits the memory limit"):
        choose_pipeline(_model(), _sample(), world_size=4, profile=TOY, memory_limit_bytes=1)


def test_fixed_choices_stay_fixed():
    found = choose_pipeline(
        _model(),
        _sample(),
        world_size=4,
        pp=2,
        schedule="Interleaved1F1B",
        n_microbatches=4,
        hardware="CPU",
        profile=TOY,
    )
    cands = {(p.candidate.pp, p.candidate.schedule, p.candidate.microbatches) for p in found.priced}
    assert cands == {(2, "Interleaved1F1B", 4)}
    assert {p.candidate.virtual for p in found.priced} == {2, 3, 4}


def test_flops_profile_choice_on_the_default_profile():
    """Without a profile the model's FLOPs price it; the choice is deterministic."""
    a = choose_pipeline(_model(), _sample(), world_size=4, hardware="H100", gpus_per_node=2)
    b = choose_pipeline(_model(), _sample(), world_size=4, hardware="H100", gpus_per_node=2)
    assert a.chosen.candidate == b.chosen.candidate
    assert a.chosen.candidate.pp * a.chosen.candidate.dp == 4


def test_bad_input_gets_a_clear_error():
    model, sample = _model(), _sample()
    with pytest.raises(ValueError, match="pp=3 does not divide the 4 ranks"):
        choose_pipeline(model, sample, world_size=4, pp=3)
    with pytest.raises(ValueError, match="2 layers cannot fill 4 pipeline stages"):
        choose_pipeline(_model(2), sample, world_size=4, pp=4)
    with pytest.raises(ValueError, match="batch must split into dp parts"):
        choose_pipeline(model, sample, world_size=4, pp=2, n_microbatches=3)
    with pytest.raises(ValueError, match="world_size=1"):
        choose_pipeline(model, sample, world_size=1)
    with pytest.raises(ValueError, match="schedule 'ZeroBubble'"):
        choose_pipeline(model, sample, world_size=4, schedule="ZeroBubble")
    with pytest.raises(ValueError, match="needs Interleaved1F1B"):
        choose_pipeline(model, sample, world_size=4, schedule="1F1B", virtual_stages=2)
    with pytest.raises(ValueError, match="a DeviceMesh or 'auto'"):
        plan_pipeline(model, "everything", sample)
    with pytest.raises(ValueError, match="pass world_size"):
        plan_pipeline(model, "auto", sample)  # no process group: the ranks are unknown
    with pytest.raises(ValueError, match="chose pp=.* run under torchrun with 4 ranks"):
        plan_pipeline(model, "auto", sample, world_size=4)  # chosen, but no group to run on


def test_bench_candidates_and_report():
    """bench/pipeline_plans.py's candidate sets (240 a model), and a search's report."""
    from autoshard.pipeline.search import candidates, search

    assert len(candidates(512, 2048, 126)) == 240
    assert len(candidates(256, 1024, 80)) == 240
    small = candidates(8, 16, LAYERS, tps=(1, 2), pps=(1, 2, 4), fsdps=("step",))
    found = search(small, {1: TOY, 2: TOY}, LAYERS, memory_limit_bytes=2e6, hardware="H100")
    assert found.chosen is min(found.fitting(), key=lambda p: p.step_us)
    assert all(p.fits == (p.peak_bytes <= 2e6) for p in found.priced)
    report = found.report(top=3)
    assert report.startswith(f"{len(small)} candidates priced, {len(found.fitting())} fit")
    assert report.count("\n| ") == 1 + 3 and "| chosen |" in report
    with pytest.raises(ValueError, match=r"no StageProfile for tp=\[2\]"):
        search(small, {1: TOY}, LAYERS)
