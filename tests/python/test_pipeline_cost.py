"""Pipeline pricing from Python (autoshard._core.price_pipeline and balanced_split): one call
each against the closed forms of uniform stages, and the ValueError of bad input. The C++
tests (tests/cpp/test_pipeline_cost.cpp) cover the schedules in depth."""

import math

import pytest

from autoshard import _core


def _stages(count, f, b):
    stage = dict(forward_us=f, backward_us=b, saved_bytes=10, resident_bytes=100, send_bytes=0)
    return [stage] * count


def test_price_pipeline_uniform_1f1b():
    p, m, f, b = 4, 8, 1.0, 2.0
    e = _core.price_pipeline("1F1B", p, m, _stages(p, f, b), 1e9, 0.0, [0.0, 0.0, 0.0, 10.0])
    assert math.isclose(e["makespan_us"], (m + p - 1) * (f + b))
    # Rank 3's last backward ends (p - 1) backwards before rank 0's.
    assert math.isclose(e["step_us"], (m + p - 1) * (f + b) - (p - 1) * b + 10.0)
    assert math.isclose(e["bubble_fraction"], (p - 1) / (m + p - 1))
    assert e["rank_peak_in_flight"] == [4, 3, 2, 1]
    assert e["rank_peak_bytes"] == [140, 130, 120, 110]
    assert e["timeline"][3][:2] == [("F", 3, 0, 3.0, 4.0), ("B", 3, 0, 4.0, 6.0)]
    with pytest.raises(
        ValueError, match=r"microbatches \(6\) to be a multiple of the pipeline ranks \(4\)"
    ):
        _core.price_pipeline("Interleaved1F1B", p, 6, _stages(2 * p, f, b), 1e9, 0.0, [])


def test_balanced_split():
    assert _core.balanced_split([1.0] * 8, 2, last_extra_us=4.0) == [0, 6]
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3"):
        _core.balanced_split([1.0, 1.0], 3)
