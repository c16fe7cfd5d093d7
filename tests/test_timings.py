"""Issue 16: a response's timings reports (the pure part of TTFT and tokens/s)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.actors.timings import RunTimings, report_cancel


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.first: list[float] = []
        self.done: list[tuple[int, float]] = []
        self.reasons: list[str] = []
        self.fail = fail

    def first_token(self, seconds: float) -> None:
        self.first.append(seconds)
        if self.fail:
            raise RuntimeError("observer broke")

    def finished(self, tokens: int, decode_seconds: float) -> None:
        self.done.append((tokens, decode_seconds))

    def cancelled(self, reason: str) -> None:
        self.reasons.append(reason)


@given(st.lists(st.integers(min_value=0, max_value=5), max_size=30))
def test_first_token_once_and_decode_rate_at_the_end(outputs: list[int]) -> None:
    recorder = Recorder()
    timings = RunTimings(recorder)
    for index, tokens in enumerate(outputs):
        timings.saw(tokens, final=index == len(outputs) - 1)
    total = sum(outputs)
    assert len(recorder.first) == (1 if total > 0 else 0)
    assert all(seconds >= 0 for seconds in recorder.first)
    # The terminal output reports the tokens after the first, when there are any and time passed.
    assert len(recorder.done) <= 1
    for tokens, seconds in recorder.done:
        assert tokens == total - 1
        assert seconds > 0
    if total < 2:
        assert recorder.done == []


def test_no_observer_measures_nothing_and_a_failing_one_never_raises() -> None:
    RunTimings(None).saw(3, final=True)
    report_cancel(None, "shutdown")
    broken = Recorder(fail=True)
    RunTimings(broken).saw(1, final=False)  # logged, not raised
    assert broken.first != []
    recorder = Recorder()
    report_cancel(recorder, None)
    report_cancel(recorder, "cancel requested")
    assert recorder.reasons == ["other", "cancel requested"]
