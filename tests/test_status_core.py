"""Issue 16: the status page's numbers (pure, Hypothesis) and its history actor's bounds."""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.actors.status import (
    HISTORY_SECONDS,
    REQUEST_LINES,
    RequestLine,
    Sample,
    bucket_deltas,
    quantile,
    rates,
    run_status_history,
)
from mlx_responses.actors.supervisor import SupervisorStatistics
from mlx_responses.engine.thread import ModelStatistics
from mlx_responses.http.metrics import TTFT_BUCKETS

BOUNDS = (*map(float, TTFT_BUCKETS), math.inf)


def cumulative(observations: list[float]) -> tuple[int, ...]:
    return tuple(sum(1 for o in observations if o <= bound) for bound in BOUNDS)


observations = st.lists(st.floats(0, 60, allow_nan=False), max_size=200)


@given(observations, st.floats(0.001, 1.0))
def test_a_quantile_falls_in_the_bucket_of_the_true_one(seen: list[float], q: float) -> None:
    estimate = quantile(q, BOUNDS, cumulative(seen))
    if not seen:
        assert estimate is None
        return
    true = sorted(seen)[math.ceil(q * len(seen)) - 1]
    index = bisect.bisect_left(BOUNDS, true)
    lower = BOUNDS[index - 1] if index else 0.0
    assert estimate is not None
    if math.isinf(BOUNDS[index]):
        assert estimate == lower  # past the last finite bound: that bound
    else:
        assert lower <= estimate <= BOUNDS[index]


@given(observations, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_quantiles_grow_with_q(seen: list[float], a: float, b: float) -> None:
    counts = cumulative(seen)
    low, high = sorted((a, b))
    lo, hi = quantile(low, BOUNDS, counts), quantile(high, BOUNDS, counts)
    assert (lo is None) == (hi is None) == (not seen)
    if lo is not None and hi is not None:
        assert 0 <= lo <= hi <= TTFT_BUCKETS[-1]


@given(observations, observations)
def test_bucket_deltas_count_what_was_observed_between(old: list[float], new: list[float]) -> None:
    assert bucket_deltas(cumulative(old), cumulative(old + new)) == cumulative(new)


def sample(at: float, tokens: int) -> Sample:
    return Sample(at, 0, 0, 0, 0, tokens, 0, 0, 0, 0, 0, ())


@given(st.lists(st.tuples(st.floats(0.01, 5), st.integers(0, 1000)), min_size=1, max_size=50))
def test_rates_add_up_to_the_counter(steps: list[tuple[float, int]]) -> None:
    samples, at, tokens = [sample(0.0, 0)], 0.0, 0
    for gap, more in steps:
        at, tokens = at + gap, tokens + more
        samples.append(sample(at, tokens))
    found = rates(samples, lambda s: s.tokens_generated)
    assert len(found) == len(steps)
    spans = [b.at - a.at for a, b in itertools.pairwise(samples)]
    total = sum(rate * span for (_, rate), span in zip(found, spans, strict=True))
    assert math.isclose(total, tokens, rel_tol=1e-9, abs_tol=1e-6)
    assert all(rate >= 0 for _, rate in found)


def test_a_counter_that_restarts_counts_from_zero() -> None:
    found = rates([sample(0, 500), sample(1, 20)], lambda s: s.tokens_generated)
    assert found == [(1, 20.0)]


@dataclass
class Board:
    """Stands in for the model's and the supervisor's snapshots (read, never messaged)."""

    tokens: int = 0

    def statistics(self) -> Any:
        self.tokens += 3
        return replace(ModelStatistics(), tokens_generated=self.tokens)


class Books:
    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(running=1)


class Ttft:
    ttft_bounds = BOUNDS

    def ttft_counts(self) -> tuple[int, ...]:
        return cumulative([0.02])


def line(path: str) -> RequestLine:
    return RequestLine(0.0, "GET", path, 200, 1.0, None, False)


async def test_the_history_keeps_five_minutes_and_each_tenants_last_requests(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with trio.open_nursery() as nursery:
        status = await nursery.start(run_status_history, Board(), Books(), Ttft())
        for index in range(REQUEST_LINES + 5):
            await status.saw_request("alice", line(f"/a/{index}"))
        await status.saw_request("bob", line("/b"))
        await trio.sleep(HISTORY_SECONDS + 100)
        alice = await status.history("alice")
        bob = await status.history("bob")
        nobody = await status.history("")
        nursery.cancel_scope.cancel()
    # The ring holds HISTORY_SECONDS of one-second samples, plus the one taken for the ask.
    assert len(alice.samples) == HISTORY_SECONDS + 2
    assert [s.tokens_generated for s in alice.samples] == sorted(
        s.tokens_generated for s in alice.samples
    )
    assert alice.samples[-1].running == 1
    assert [r.path for r in alice.requests] == [
        f"/a/{i}" for i in reversed(range(5, REQUEST_LINES + 5))
    ]
    assert [r.path for r in bob.requests] == ["/b"]
    assert nobody.requests == ()
    assert alice.ttft_bounds == BOUNDS
