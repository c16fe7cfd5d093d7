"""``bench/step_period.py``'s decode figures over hand-written step records: only a decode call
that follows another decode call counts (a prefill step, or the first step after one, does
not), the gap is measured from the earlier call's end, and the figures are medians."""

from __future__ import annotations

import pytest

from .scripts_loader import bench_module

sp = bench_module("step_period")


def test_only_decode_after_decode_counts() -> None:
    records = [
        (0.000, 0.010, 0, 1),  # a prefill step: no token
        (0.011, 0.012, 1, 0),  # the first decode step follows a prefill: not counted
        (0.0125, 0.0135, 1, 0),  # counted: 1.0 ms step after a 0.5 ms gap
        (0.0140, 0.0160, 1, 0),  # counted: 2.0 ms step after a 0.5 ms gap
        (0.0170, 0.0180, 1, 1),  # a step with prompt progress: not counted
        (0.0181, 0.0190, 1, 0),  # follows a prefill step: not counted
        (0.0200, 0.0230, 1, 0),  # counted: 3.0 ms step after a 1.0 ms gap
    ]
    found = sp.decode_figures(records)
    assert found is not None
    assert found.steps == 3
    assert found.next_us == pytest.approx(2000.0)
    assert found.between_us == pytest.approx(500.0)
    assert found.period_us == pytest.approx(2500.0)


def test_no_decode_pair_gives_none() -> None:
    assert sp.decode_figures([(0.0, 0.01, 0, 1), (0.02, 0.03, 1, 0)]) is None
    assert sp.decode_figures([]) is None
