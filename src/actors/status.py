"""The status page's history: the batch over the last minutes and the last requests.

Invariants:
- This task alone owns the two rings: the samples (at most ``HISTORY_SECONDS`` of them, one
  per ``SAMPLE_SECONDS``) and each tenant's last requests (at most ``REQUEST_LINES``). Others
  reach them by message: the HTTP edge tells it each request it answered (``SawRequest``), the
  status page asks for a tenant's view (``AskHistory``), its own clock says when to sample
  (``Tick``).
- A sample reads snapshots only (the model's and the supervisor's ``statistics()``, the
  time-to-first-token histogram's cumulative counts): it sends no message to another actor
  and never waits on the model.
- A tenant's view holds only that tenant's request lines; the samples are batch totals, in
  which other tenants' work appears only as anonymous counts.
- The numbers the page shows are computed by pure functions below (rates from counter
  deltas, percentiles from histogram bucket deltas as Prometheus' ``histogram_quantile``
  does), tested with Hypothesis.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, assert_never

import trio

from .kit import Reply, ask, open_mailbox
from .model import ModelHandle
from .supervisor import ResponseSupervisorHandle

SAMPLE_SECONDS = 1.0
HISTORY_SECONDS = 300
REQUEST_LINES = 20


class TtftHistogram(Protocol):
    """Where responses' time to first token is counted (``http.metrics.Metrics``)."""

    @property
    def ttft_bounds(self) -> tuple[float, ...]:
        """The buckets' upper bounds, ascending, the last one ``inf``."""
        ...

    def ttft_counts(self) -> tuple[int, ...]:
        """Cumulative counts per bucket (as ``_bucket{le=...}``), one per bound."""
        ...


@dataclass(frozen=True, slots=True)
class Sample:
    """The batch at one moment; the counters are totals since start."""

    at: float  # Unix time
    active: int
    queued: int
    prefilling: int
    decoding: int
    tokens_generated: int
    prompt_tokens: int
    cache_hits: int
    cache_misses: int
    running: int  # responses running, every tenant's (an anonymous count)
    jobs_active: int
    ttft_counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RequestLine:
    """One answered HTTP request, as the request log writes it (no key, no body)."""

    at: float  # Unix time
    method: str
    path: str
    status: int
    duration_ms: float
    response_id: str | None
    stream: bool


@dataclass(frozen=True, slots=True)
class StatusHistory:
    """One tenant's view: the samples (every tenant's batch) and its own last requests."""

    samples: tuple[Sample, ...]
    requests: tuple[RequestLine, ...]  # newest first
    ttft_bounds: tuple[float, ...]


# -- messages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """Sender: this actor's own clock. Take a sample."""


@dataclass(frozen=True, slots=True)
class SawRequest:
    """Sender: the HTTP edge, after answering a request of ``owner``."""

    owner: str
    line: RequestLine


@dataclass(frozen=True, slots=True)
class AskHistory:
    """Sender: the status page. Reply: ``owner``'s view."""

    owner: str
    reply: Reply[StatusHistory]


StatusMessage = Tick | SawRequest | AskHistory


class StatusHandle:
    def __init__(
        self, mailbox: trio.MemorySendChannel[StatusMessage], ttft_bounds: tuple[float, ...]
    ) -> None:
        self._mailbox = mailbox
        self.ttft_bounds = ttft_bounds

    async def saw_request(self, owner: str, line: RequestLine) -> None:
        """Never raises: once the actor has stopped (shutdown) the line is dropped."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._mailbox.send(SawRequest(owner, line))

    async def history(self, owner: str) -> StatusHistory:
        return await ask(self._mailbox, lambda reply: AskHistory(owner, reply))


async def run_status_history(
    model: ModelHandle,
    responses: ResponseSupervisorHandle,
    ttft: TtftHistogram,
    *,
    interval: float = SAMPLE_SECONDS,
    task_status: trio.TaskStatus[StatusHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    send: trio.MemorySendChannel[StatusMessage]
    receive: trio.MemoryReceiveChannel[StatusMessage]
    send, receive = open_mailbox()
    samples: deque[Sample] = deque(maxlen=int(HISTORY_SECONDS / interval) + 1)
    requests: dict[str, deque[RequestLine]] = {}

    def sample() -> Sample:
        batch = model.statistics()
        books = responses.statistics()
        return Sample(
            at=time.time(),
            active=batch.active,
            queued=batch.queued,
            prefilling=batch.prefilling,
            decoding=batch.decoding,
            tokens_generated=batch.tokens_generated,
            prompt_tokens=batch.prompt_tokens_processed,
            cache_hits=batch.prompt_cache.hits,
            cache_misses=batch.prompt_cache.misses,
            running=books.running,
            jobs_active=books.jobs_active,
            ttft_counts=ttft.ttft_counts(),
        )

    async with trio.open_nursery() as nursery, receive:
        nursery.start_soon(_clock, send.clone(), interval)
        samples.append(sample())
        task_status.started(StatusHandle(send, ttft.ttft_bounds))
        async for message in receive:
            match message:
                case Tick():
                    samples.append(sample())
                case SawRequest(owner, line):
                    requests.setdefault(owner, deque(maxlen=REQUEST_LINES)).appendleft(line)
                case AskHistory(owner, reply):
                    # The newest sample is taken now, so the view is never a tick old.
                    now = (*samples, sample())
                    reply.send(StatusHistory(now, tuple(requests.get(owner, ())), ttft.ttft_bounds))
                case _:
                    assert_never(message)


async def _clock(mailbox: trio.MemorySendChannel[StatusMessage], interval: float) -> None:
    async with mailbox:
        while True:
            await trio.sleep(interval)
            await mailbox.send(Tick())


# -- the pure core: what the page shows --------------------------------------------------------


def rates(samples: Sequence[Sample], counter: Callable[[Sample], int]) -> list[tuple[float, float]]:
    """Per-second rate of a counter between consecutive samples: (time, rate) pairs. A
    counter that went down (a restart of the model) counts from zero."""
    out: list[tuple[float, float]] = []
    for before, after in itertools.pairwise(samples):
        span = after.at - before.at
        if span <= 0:
            continue
        delta = counter(after) - counter(before)
        out.append((after.at, (delta if delta >= 0 else counter(after)) / span))
    return out


def bucket_deltas(older: Sequence[int], newer: Sequence[int]) -> tuple[int, ...]:
    """The observations between two cumulative bucket snapshots (never negative)."""
    return tuple(max(n - o, 0) for o, n in zip(older, newer, strict=True))


def quantile(q: float, bounds: Sequence[float], cumulative: Sequence[int]) -> float | None:
    """The ``q`` quantile (0..1) of observations in cumulative buckets, interpolated linearly
    inside the bucket it falls in (Prometheus' ``histogram_quantile``); None without any
    observation. In the last (``+Inf``) bucket it answers the highest finite bound."""
    if not cumulative or cumulative[-1] <= 0:
        return None
    total = cumulative[-1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            inside = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * max(inside, 0.0)
        lower_bound, lower_count = bound, count
    return lower_bound


def ratio(part: int, whole: int) -> float | None:
    return part / whole if whole > 0 else None
