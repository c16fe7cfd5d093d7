"""A response's life as one table (``protocol/lifecycle.py``): every input in every phase, and
any walk the table allows fed to the real event machine, which must accept every input the
table names and end with exactly one terminal event."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.protocol.events.machine import (
    TERMINAL_EVENT_TYPES,
    Cancel,
    Fail,
    Finish,
    MachineInput,
    ResponseMachine,
    Start,
)
from mlx_responses.protocol.lifecycle import (
    CANCEL_INPUT,
    NEXT_ACTION,
    TRANSITIONS,
    Action,
    CancelReason,
    Feed,
    Input,
    LifecycleError,
    Move,
    Phase,
    Route,
    advance,
    announced,
    next_action,
    route_of,
)
from mlx_responses.protocol.objects import JsonObject, ResponseConfig, Usage

ORDER = list(Phase)
# The one way back: a server tool's continuation goes on decoding.
LOOPS = {(Phase.CONTINUING, Phase.DECODING)}
TERMINAL_FEEDS = {Feed.FINISH, Feed.STEER, Feed.CANCEL, Feed.FAIL}
ENDS = {Input.FINISHED, Input.STEERED, Input.CANCELLED, Input.SHUTDOWN, Input.HUNG_UP, Input.FAILED}


@given(st.sampled_from(Phase), st.sampled_from(Input))
def test_every_input_in_every_phase_is_the_tables_move_or_refused(
    phase: Phase, happened: Input
) -> None:
    if (phase, happened) in TRANSITIONS:
        move = advance(phase, happened)
        assert move is TRANSITIONS[phase, happened]
        after = move.phase
        assert ORDER.index(after) >= ORDER.index(phase) or (phase, after) in LOOPS
        assert announced(after) or not announced(phase)
        # A move into finishing feeds exactly one terminal input, last; nothing else does.
        terminal = [feed for feed in move.feeds if feed in TERMINAL_FEEDS]
        ending = after in (Phase.FINISHING, Phase.FAILING)
        assert len(terminal) == ending
        assert not terminal or move.feeds[-1] is terminal[0]
        assert move.records <= ending
    else:
        with pytest.raises(LifecycleError):
            advance(phase, happened)


def test_the_ends_of_a_response() -> None:
    """Every end is open wherever the response is running; a hang-up alone leaves nothing."""
    for phase in (Phase.WAITING, Phase.PREFILLING, Phase.DECODING, Phase.CONTINUING):
        for happened in ENDS - ({Input.FINISHED} if not announced(phase) else set()):
            move = advance(phase, happened)
            assert move.phase is Phase.FINISHING
            assert move.records is (happened is not Input.HUNG_UP)
            assert move.release is (happened is not Input.FINISHED)
    # A response not yet started is started when steered: incomplete needs in_progress.
    assert advance(Phase.WAITING, Input.STEERED).feeds == (Feed.START, Feed.STEER)
    assert advance(Phase.DECODING, Input.STEERED).feeds == (Feed.STEER,)
    for reason in get_args(CancelReason):
        assert CANCEL_INPUT[reason] in ENDS - {Input.FINISHED}
    assert CANCEL_INPUT["client disconnected"] is Input.HUNG_UP
    assert CANCEL_INPUT["steered"] is Input.STEERED


def _machine_input(feed: Feed) -> MachineInput:
    usage = Usage(1, 1)
    match feed:
        case Feed.START:
            return Start()
        case Feed.FINISH:
            return Finish("stop", usage, 1)
        case Feed.STEER:
            return Finish("steered", usage, 1)
        case Feed.CANCEL:
            return Cancel(usage)
        case Feed.FAIL:
            return Fail("server_error", "failed", usage)


class _Driver:
    """What ``ResponseRun`` does with a move, minus the I/O: the machine is fed, the status
    follows, a store failure restores the machine as it was before its terminal input."""

    def __init__(self, background: bool) -> None:
        config = ResponseConfig(model="m", background=background)
        self.machine = ResponseMachine("resp_1", config, 1)
        self.phase = Phase.PREPARING
        self.status = "queued"
        self.events: list[JsonObject] = []
        self.before: ResponseMachine | None = None

    def step(self, happened: Input) -> Move:
        move = advance(self.phase, happened)
        if happened is Input.STORE_FAILED:
            assert self.before is not None
            self.machine = self.before
            self.events = self.events[: self.published]
        elif move.phase is Phase.FINISHING:
            self.before, self.published = self.machine.fork(), len(self.events)
        for feed in move.feeds:
            self.events += self.machine.feed(_machine_input(feed))
        self.phase = move.phase
        if move.status is not None:
            self.status = move.status
        return move


@given(st.booleans(), st.lists(st.sampled_from(Input), max_size=30))
def test_any_walk_the_table_allows_is_one_the_event_machine_accepts(
    background: bool, inputs: list[Input]
) -> None:
    run = _Driver(background)
    for happened in inputs:
        if (run.phase, happened) not in TRANSITIONS:
            with pytest.raises(LifecycleError):
                advance(run.phase, happened)
            continue
        run.step(happened)  # the machine raises ProtocolError on an input it does not allow
        if run.phase not in (Phase.FINISHING, Phase.FAILING, Phase.ENDED, Phase.PREPARING):
            # What /status shows is what the machine says while it runs.
            assert run.status == run.machine.status
        ending = (Phase.FINISHING, Phase.FAILING, Phase.ENDED)
        assert run.machine.terminal is (run.phase in ending) or (
            run.phase is Phase.ENDED and not run.events  # refused: nothing was published
        )
    terminal = [e for e in run.events if e["type"] in TERMINAL_EVENT_TYPES]
    assert len(terminal) == (1 if run.machine.terminal else 0)
    if terminal:
        assert run.events[-1] is terminal[0]
    if run.phase is Phase.ENDED:
        assert all((Phase.ENDED, i) not in TRANSITIONS for i in Input)


def test_every_phase_can_end() -> None:
    """From every phase some inputs reach ENDED: no response can be stuck by the table."""
    reach = {Phase.ENDED}
    changed = True
    while changed:
        changed = False
        for (phase, _), move in TRANSITIONS.items():
            if move.phase in reach and phase not in reach:
                reach.add(phase)
                changed = True
    assert reach == set(Phase)


def _walk(*inputs: Input) -> Phase:
    phase = Phase.PREPARING
    for happened in inputs:
        phase = advance(phase, happened).phase
    return phase


def test_the_usual_lives() -> None:
    i = Input
    # A streamed create; a refusal; a job cancelled while queued.
    assert _walk(i.PREPARED, i.ADMITTED, i.STARTED, i.FINISHED, i.STORED) is Phase.ENDED
    assert _walk(i.PREPARED, i.REFUSED) is Phase.ENDED
    assert _walk(i.PREPARED, i.ADMITTED, i.CANCELLED, i.STORED) is Phase.ENDED
    # A server tool's call, its output and the continuation: decoding again.
    tool = (i.TOOL_CALLED, i.TOOL_OUTPUT, i.CONTINUATION_ADMITTED)
    assert _walk(i.PREPARED, i.ADMITTED, i.STARTED, *tool, *tool) is Phase.DECODING
    # No continuation: it finishes with the tool's output.
    assert _walk(i.PREPARED, i.ADMITTED, i.STARTED, *tool[:2], i.FINISHED) is Phase.FINISHING
    # A compaction trigger: no sequence of its own, started once its summary is done.
    assert _walk(i.PREPARED, i.STARTED, i.FINISHED, i.STORED) is Phase.ENDED
    # The store failed: it ends failed all the same.
    assert _walk(i.PREPARED, i.ADMITTED, i.FAILED, i.STORE_FAILED, i.STORED) is Phase.ENDED
    with pytest.raises(LifecycleError):  # a store fails a response once
        _walk(i.PREPARED, i.ADMITTED, i.FAILED, i.STORE_FAILED, i.STORE_FAILED)
    with pytest.raises(LifecycleError):
        _walk(i.PREPARED, i.ADMITTED, i.STARTED, i.REFUSED)  # it exists: not refusable
    with pytest.raises(LifecycleError):
        _walk(i.PREPARED, i.ADMITTED, i.FINISHED)  # not started: it cannot complete


@given(st.sampled_from(Route), st.sampled_from(Phase))
def test_every_action_moves_from_a_running_phase(route: Route, phase: Phase) -> None:
    action = next_action(route, phase)
    if phase in (Phase.PREPARING, Phase.FINISHING, Phase.FAILING, Phase.ENDED):
        assert action is None
    if action is None:
        return
    assert (route, phase) in NEXT_ACTION
    # Each action has an input out of its phase that is not an end.
    assert any(
        (phase, happened) in TRANSITIONS and happened not in ENDS | {Input.REFUSED}
        for happened in Input
    ) or action in (Action.PREFILL, Action.COMPACT_WHOLE)


def test_routes() -> None:
    assert route_of(generate=False, compact_now=True, admitted=False) is Route.WARM_UP
    assert route_of(generate=True, compact_now=True, admitted=False) is Route.COMPACT_NOW
    assert route_of(generate=True, compact_now=False, admitted=False) is Route.ADMIT_LATER
    assert route_of(generate=True, compact_now=False, admitted=True) is Route.GENERATE
    assert next_action(Route.GENERATE, Phase.PREFILLING) is Action.GENERATE
    assert next_action(Route.WARM_UP, Phase.PREFILLING) is Action.PREFILL
    assert next_action(Route.COMPACT_NOW, Phase.WAITING) is Action.COMPACT_WHOLE
    assert next_action(Route.ADMIT_LATER, Phase.WAITING) is Action.COMPACT_THEN_ADMIT
    assert next_action(Route.GENERATE, Phase.TOOL_RUNNING) is Action.RUN_SERVER_TOOL
    assert next_action(Route.GENERATE, Phase.CONTINUING) is Action.ADMIT_CONTINUATION
