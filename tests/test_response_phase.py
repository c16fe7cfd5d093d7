"""Issue 25: a response's lifecycle table (``protocol/phase.py``), over every (phase, step)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.protocol.events.phase import (
    TRANSITIONS,
    Phase,
    PhaseError,
    Step,
    advance,
    announced,
)

ORDER = list(Phase)


@given(st.sampled_from(Phase), st.sampled_from(Step))
def test_every_phase_and_step_is_either_in_the_table_or_refused(
    phase: Phase, happened: Step
) -> None:
    if (phase, happened) in TRANSITIONS:
        after = advance(phase, happened)
        # Never backwards: a response only moves on (a continuation stays decoding).
        assert ORDER.index(after) >= ORDER.index(phase)
        assert announced(after) or not announced(phase)
    else:
        with pytest.raises(PhaseError):
            advance(phase, happened)


@given(st.lists(st.sampled_from(Step), max_size=20))
def test_any_allowed_walk_from_preparing_ends_once_and_stays_ended(steps: list[Step]) -> None:
    phase = Phase.PREPARING
    ended = 0
    for happened in steps:
        if (phase, happened) not in TRANSITIONS:
            continue
        phase = advance(phase, happened)
        ended += phase is Phase.ENDED
    assert ended <= 1
    if phase is Phase.ENDED:
        assert all((Phase.ENDED, s) not in TRANSITIONS for s in Step)


def test_every_phase_can_end() -> None:
    """From every phase some steps reach ENDED: no response can be stuck by the table."""
    reach = {Phase.ENDED}
    changed = True
    while changed:
        changed = False
        for (phase, _), after in TRANSITIONS.items():
            if after in reach and phase not in reach:
                reach.add(phase)
                changed = True
    assert reach == set(Phase)


def test_the_usual_lives() -> None:
    def walk(*steps: Step) -> Phase:
        phase = Phase.PREPARING
        for happened in steps:
            phase = advance(phase, happened)
        return phase

    # A streamed create, a tool search's continuation, a refusal, a job cancelled while queued.
    assert walk(Step.PREPARED, Step.ADMITTED, Step.STARTED, Step.TERMINAL) is Phase.FINISHING
    assert walk(Step.PREPARED, Step.ADMITTED, Step.STARTED, Step.ADMITTED) is Phase.DECODING
    assert walk(Step.PREPARED, Step.REFUSED) is Phase.ENDED
    # A compaction_trigger: no sequence of its own, started once its summary is done.
    assert walk(Step.PREPARED, Step.STARTED, Step.TERMINAL, Step.CLOSED) is Phase.ENDED
    assert walk(Step.PREPARED, Step.ADMITTED, Step.TERMINAL, Step.CLOSED) is Phase.ENDED
    with pytest.raises(PhaseError):
        walk(Step.PREPARED, Step.ADMITTED, Step.STARTED, Step.REFUSED)  # it exists: not refusable
