"""The SSE writer (``http.pipeline.follow``) over a real ``EventLog``: each write carries every
event pending since the last one; the events stay the same, whole, in order, none lost; each
event is encoded once for every subscriber. And the bound on how long a run under load lets
its deltas pile up (``pacing.delta_interval``, issue 12). The producers pace their events on
Trio's ``MockClock`` (autojump): the writer wakes between them as on any machine, and no test
waits on the wall clock."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.actors.event_log import EventLog
from mlx_responses.actors.pacing import (
    MAX_INTERVAL_SECONDS,
    answered_whole,
    delta_interval,
    next_linger,
)
from mlx_responses.http.pipeline import follow
from mlx_responses.http.schemas import parse_create_request
from mlx_responses.protocol.events.sse import SseDecoder, encode_sse
from mlx_responses.protocol.tools.hosted import HostedSwitches


def delta(seq: int) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "sequence_number": seq,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": f"tok{seq} ",
        "logprobs": [],
    }


async def collect(log: EventLog, chunks: list[bytes]) -> None:
    async for chunk in follow(log):
        chunks.append(chunk)


async def produce(log: EventLog, count: int, every: float, burst: int = 1) -> list[dict[str, Any]]:
    """``burst`` events per ``every`` seconds (a run's coalesced output each), then the
    terminal event."""
    events = [delta(i) for i in range(count)]
    for start in range(0, count, burst):
        log.append(events[start : start + burst])
        await trio.sleep(every)
    final = {"type": "response.completed", "sequence_number": count, "response": {"id": "r"}}
    log.append([final])
    log.close({"id": "r"})
    return [*events, final]


def decode(chunks: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    decoder = SseDecoder()
    out = [event for chunk in chunks for event in decoder.feed(chunk)]
    assert decoder.at_boundary  # every chunk ended on a whole event
    return out


async def run(
    count: int = 40, every: float = 0.002, burst: int = 1
) -> tuple[list[Any], list[bytes]]:
    log = EventLog("resp_1", lambda: {"id": "resp_1"})
    chunks: list[bytes] = []
    sent: list[dict[str, Any]] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, log, chunks)

            async def producer() -> None:
                sent.extend(await produce(log, count, every, burst))

            nursery.start_soon(producer)
    return sent, chunks


async def test_each_write_carries_every_pending_event_and_none_is_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent, chunks = await run(count=40, every=0.01, burst=8)
    received = decode(chunks)
    assert [data for _, data in received] == sent
    assert [name for name, _ in received] == [event["type"] for event in sent]
    assert [data["sequence_number"] for _, data in received] == list(range(len(sent)))
    # A burst is one write: far fewer writes than events.
    assert len(chunks) < len(sent) / 3
    assert b"".join(chunks) == b"".join(encode_sse(event) for event in sent)


async def test_the_writer_sends_as_events_come(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent, chunks = await run(count=10, every=0.01)
    assert [data for _, data in decode(chunks)] == sent
    assert len(chunks) >= 10  # one write per wake-up: nothing held back


async def test_a_late_subscriber_and_a_live_one_get_the_same_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log = EventLog("resp_1", lambda: {"id": "resp_1"})
    live: list[bytes] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, log, live)
            nursery.start_soon(produce, log, 5, 0.001)
    late = [chunk async for chunk in follow(log)]
    assert b"".join(late) == b"".join(live)
    # Starting after an event (a replaying GET's starting_after) skips exactly those.
    tail = [chunk async for chunk in follow(log, 3)]
    assert [d["sequence_number"] for _, d in decode(tail)] == [3, 4, 5]


def test_the_delta_interval_grows_with_the_streams_and_is_bounded() -> None:
    assert 0 < delta_interval(1) < delta_interval(4) < delta_interval(8) <= MAX_INTERVAL_SECONDS
    assert delta_interval(1000) == MAX_INTERVAL_SECONDS


@given(
    outputs=st.lists(st.integers(min_value=0, max_value=4), max_size=12),
    decoding=st.integers(min_value=1, max_value=64),
    whole=st.booleans(),
)
def test_a_run_lingers_only_once_its_first_token_went_out(
    outputs: list[int], decoding: int, whole: bool
) -> None:
    """Outputs with no token (a prefill's end) before the first token leave the next receive
    unlingered, so the first token is sent the moment it exists (and timed); from the first
    token on, every receive lingers ``delta_interval``, or 250 ms for a response answered
    whole, whatever the batch."""
    linger = 0.0
    seen_token = False
    lingers = MAX_INTERVAL_SECONDS if whole else delta_interval(decoding)
    for new_tokens in outputs:
        linger = next_linger(linger, new_tokens, decoding, whole=whole)
        seen_token = seen_token or new_tokens > 0
        assert linger == (lingers if seen_token else 0.0)


def test_only_a_foreground_answer_not_streamed_and_running_no_server_tool_is_answered_whole() -> (
    None
):
    switches = HostedSwitches(web_search=True, mcp=True)
    base = {"model": "m", "input": "hi"}
    mcp = {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example.com/mcp"}
    cases = [
        (base, True),
        ({**base, "stream": False}, True),
        ({**base, "tools": [{"type": "function", "name": "f", "parameters": {}}]}, True),
        ({**base, "stream": True}, False),
        ({**base, "background": True}, False),
        ({**base, "tools": [{"type": "web_search"}]}, False),
        ({**base, "tools": [mcp]}, False),
    ]
    for body, whole in cases:
        assert answered_whole(parse_create_request(body, hosted=switches)) is whole, body
