"""How long a response's run lets its sequence's output pile up between receives."""

from __future__ import annotations

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


def next_linger(linger: float, new_tokens: int, decoding: int) -> float:
    """The linger of a run's next receive: none until its first token went out (a prefill's
    end alone is not one: the first token must not wait for a tick), then ``delta_interval``."""
    return delta_interval(decoding) if new_tokens or linger > 0 else 0.0
