"""How long a response's run lets its sequence's output pile up between receives."""

from __future__ import annotations

from ..protocol.request import CreateRequest

# The server's own work per event (the machine, the log, encoding, one transport write and one
# client read per delta) competes with the generation thread for the GIL and the cores, most
# when the engine is fast. A run that lets its sequence's tokens pile up between receives turns
# many one-token deltas into fewer, fuller ones: the same text and logprobs, in order. A delta
# waits about ``delta_interval``, at most one and a half of it (the first one and the finish
# not at all; ``SequenceSlot``'s header says when it waits longer than one), which grows with
# the sequences decoding; on a model slower than that per step nothing changes (each receive
# has one step's token anyway). The generation thread never waits on it. Runs linger to the
# same ticks of one clock (``SequenceSlot.receive``), and the generation thread's push
# nearest a tick wakes them (no Trio timer per delta), so all the streams' deltas of a tick go
# out in one pass of the event loop. Measured (A/B, 16 streams, 10M model): 15 ms per stream
# gave the engine ~4 % more of the cores than 5 ms did; a stream of 16 still gets four deltas
# a second.
BASE_INTERVAL_SECONDS = 0.01
INTERVAL_PER_STREAM_SECONDS = 0.015
MAX_INTERVAL_SECONDS = 0.25


def delta_interval(decoding: int) -> float:
    """How long a run lets output pile up while ``decoding`` sequences run."""
    return min(MAX_INTERVAL_SECONDS, BASE_INTERVAL_SECONDS + INTERVAL_PER_STREAM_SECONDS * decoding)


# A response answered whole (``answered_whole``) has no reader of its deltas: its client reads
# one object at the end. Its run still builds the events as the tokens come (the log is the
# response while it runs: a retrieval of it, live or streamed, and the status page read it),
# but wakes for them at most every ``MAX_INTERVAL_SECONDS``. Each wake of the event loop takes
# a core from the engine for longer than its own work (docs/benchmarks.md, "One stream, sixth
# pass"). Measured (bundled model, one request at a time, four 331-token answers per round, 14
# rounds interleaved): 0.925 of mlx-lm's own tokens/s at the streams' 25 ms, 0.951 at 0.25 s,
# 0.950 at 1 s and 0.955 waking at the finish only.


def answered_whole(request: CreateRequest) -> bool:
    """Whether nobody reads the response's deltas as they come: a foreground response that is
    not streamed, offering no tool the server runs (a run stops its sequence at the end of such
    a call, ``ResponseRun._apply``, so it must see the call's end when it comes)."""
    return (
        not request.stream
        and not request.config.background
        and not request.mcp_servers
        and all(tool.hosted is None for tool in request.tools)
    )


def next_linger(linger: float, new_tokens: int, decoding: int, *, whole: bool = False) -> float:
    """The linger of a run's next receive: none until its first token went out (a prefill's
    end alone is not one: the first token must not wait for a tick, and it times the first
    token for ``/metrics``), then ``delta_interval``, or the longest interval for a response
    answered ``whole``."""
    if not new_tokens and linger <= 0:
        return 0.0
    return MAX_INTERVAL_SECONDS if whole else delta_interval(decoding)
