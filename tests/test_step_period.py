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


def test_a_run_splits_into_inside_and_outside_next_and_sorts_its_gaps() -> None:
    """A 20 ms window: three calls of 4, 2 and 1 ms (7 ms inside); a 20 us gap (the loop's own
    work), a 5 ms gap (a turn's round trip); the call before the window is not counted."""
    records = [
        (0.990, 0.995, 1, 0),  # before the window
        (1.000, 1.004, 1, 1),
        (1.00402, 1.00602, 1, 0),
        (1.01102, 1.01202, 1, 0),
    ]
    split = sp.run_split(records, 1.000, 1.020)
    assert split.steps == 3
    assert split.wall_ms == pytest.approx(20.0)
    assert split.next_ms == pytest.approx(7.0)
    assert split.outside_ms == pytest.approx(13.0)
    counts = {sp.gap_label(i): gap for i, gap in enumerate(split.gaps)}
    assert counts["<30us"] == (1, pytest.approx(0.02))
    assert counts["2-10ms"] == (1, pytest.approx(5.0))
    assert sum(n for n, _ in split.gaps) == 2
    # The first call prefilled (prompt progress) for 4 ms; three tokens in three calls.
    assert (split.prompt_steps, split.prompt_ms) == (1, pytest.approx(4.0))
    assert (split.tokens, split.tokens_per_step) == (3, 1.0)


def test_the_gap_classes_cover_every_size_once() -> None:
    labels = [sp.gap_label(i) for i in range(len(sp.GAP_BOUNDS_US) + 1)]
    assert labels == ["<30us", "30-100us", "100-500us", "0.5-2ms", "2-10ms", ">=10ms"]


def test_the_median_split_is_taken_field_by_field() -> None:
    a = sp.RunSplit(10.0, 8.0, 2.0, 5, ((1, 0.1),) * 6, 1, 4.0, 40)
    b = sp.RunSplit(30.0, 20.0, 10.0, 9, ((3, 0.3),) * 6, 3, 2.0, 90)
    c = sp.RunSplit(20.0, 9.0, 11.0, 7, ((2, 0.2),) * 6, 2, 9.0, 70)
    m = sp.median_split([a, b, c])
    assert (m.wall_ms, m.next_ms, m.outside_ms, m.steps) == (20.0, 9.0, 10.0, 7)
    assert m.gaps[0] == (2, 0.2)
    assert (m.prompt_steps, m.prompt_ms, m.tokens) == (2, 4.0, 70)
