"""``compaction_trigger`` (issue 28): Codex's remote compaction, over HTTP and the WebSocket,
against the real server and model."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.protocol.items.compaction import SUMMARY_PREFIX
from mlx_responses.server import ServerHandle
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, output_text, wait_until
from .rawhttp import open_stream
from .test_lifetime import assert_nothing_left, start
from .test_websocket import Event, in_thread, sdk, strict, until_terminal

DEADLINE = 90
TRIGGER = {"type": "compaction_trigger"}
HISTORY = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": "Reply with: hello"},
    {"role": "assistant", "content": "hello"},
]
BASE = {"model": MODEL, "temperature": 0}


def summary_of(item: dict[str, Any]) -> str:
    blob = item["encrypted_content"]
    decoded = json.loads(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4)))
    summary: str = decoded["summary"]
    return summary


async def post(http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    with trio.fail_after(DEADLINE):
        return await http.post("/v1/responses", json=body)


async def test_a_trigger_answers_one_compaction_item_and_the_continuation_renders_it(
    server: ServerHandle,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        compacted = await post(http, {**BASE, "input": [*HISTORY, TRIGGER]})
        assert compacted.status_code == 200, compacted.text
        final = compacted.json()
        assert_strict_response(final)
        assert final["status"] == "completed"
        assert [item["type"] for item in final["output"]] == ["compaction"]
        item = final["output"][0]
        assert final["usage"]["output_tokens"] > 0  # the summary's
        # Codex continues with [developer, user..., compaction item, user]: the item stands in
        # for the turns before it, its summary a system message at its place.
        next_user = {"role": "user", "content": "Reply with: hello"}
        continued = await post(http, {**BASE, "input": [HISTORY[0], HISTORY[1], item, next_user]})
        summary = {"role": "system", "content": SUMMARY_PREFIX + summary_of(item)}
        expected = await post(http, {**BASE, "input": [HISTORY[0], summary, next_user]})
    assert continued.status_code == 200, continued.text
    assert expected.status_code == 200, expected.text
    assert continued.json()["usage"]["input_tokens"] == expected.json()["usage"]["input_tokens"]
    assert output_text(continued.json()) == output_text(expected.json())


async def test_a_streamed_trigger_sends_the_compaction_events(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            body = {**BASE, "input": [*HISTORY, TRIGGER], "stream": True}
            async with http.stream("POST", "/v1/responses", json=body) as reply:
                assert reply.status_code == 200
                events = parse_sse(await reply.aread())
    final = assert_stream_invariants(events)
    assert [item["type"] for item in final["output"]] == ["compaction"]
    added = [data for kind, data in events if kind == "response.output_item.added"]
    assert [data["item"]["type"] for data in added] == ["compaction"]


async def test_a_misplaced_or_lonely_trigger_is_a_400_and_nothing_runs(
    server: ServerHandle,
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        misplaced = await post(http, {**BASE, "input": [HISTORY[1], TRIGGER, HISTORY[1]]})
        nothing = await post(http, {**BASE, "input": [HISTORY[0], TRIGGER]})
        extra = await post(http, {**BASE, "input": [*HISTORY, {**TRIGGER, "x": 1}]})
    assert misplaced.status_code == 400
    assert misplaced.json()["error"]["param"] == "input[1]"
    assert "must be the final input item" in misplaced.json()["error"]["message"]
    assert nothing.status_code == 400
    assert nothing.json()["error"]["code"] == "context_length_exceeded"
    assert extra.status_code == 400
    assert extra.json()["error"]["param"] == "input[3].x"
    stats = server.model.statistics()
    assert stats.sequences_finished == 0
    assert server.store.statistics().entries == 0


async def test_a_trigger_over_the_socket_continues_from_the_compacted_history(
    server: ServerHandle,
) -> None:
    def run() -> tuple[list[Event], list[Event]]:
        with sdk(server).responses.connect() as connection:
            connection.send(
                {"type": "response.create", **BASE, "store": False, "input": [*HISTORY, TRIGGER]}
            )
            compacted = until_terminal(connection)
            item = compacted[-1]["response"]["output"][0]
            connection.send(
                {
                    "type": "response.create",
                    **BASE,
                    "store": False,
                    "input": [HISTORY[0], HISTORY[1], item, HISTORY[1]],
                }
            )
            return compacted, until_terminal(connection)

    compacted, continued = await in_thread(run)
    assert [item["type"] for item in strict(compacted)["output"]] == ["compaction"]
    assert strict(continued)["status"] in ("completed", "incomplete")


async def test_a_hang_up_mid_compaction_leaves_nothing_admitted(nursery: trio.Nursery) -> None:
    # A long history and a large window (a summary budget of 1,024 tokens): the summary
    # decodes for a while.
    server = await start(nursery, model={"context_size": 16384})
    turns = [
        {"role": role, "content": f"Count from 1 to 110. Turn {i}."}
        for i in range(12)
        for role in ("user", "assistant")
    ]
    model = server.model
    with trio.fail_after(DEADLINE):
        connection = await open_stream(
            server.base_url,
            "/v1/responses",
            {**BASE, "input": [*turns, TRIGGER], "stream": True},
        )
        # Its events go out once the summary is done (the machine takes the compaction item at
        # the start): the summary's sequence decoding is the moment to hang up.
        await wait_until(lambda: model.statistics().decoding > 0)
        await connection.aclose()
    await assert_nothing_left(server)
    stats = model.statistics()
    assert stats.sequences_cancelled == 1
    assert stats.sequences_finished == 0
