"""``bench/serving_floor.py``: the floor server (the least a streaming server does) generates what
mlx-lm driven directly generates, and its outbox lingers as the server's slot does: a reader is
woken by the first token, then takes everything pushed until its linger's end or the finish."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import trio

from .scripts_loader import bench_module

floor = bench_module("serving_floor")
throughput = bench_module("throughput")

BUNDLED = str(throughput.ROOT / "src" / "engine" / "bundled")


def test_a_lingering_reader_takes_every_token_up_to_the_finish_in_one_take() -> None:
    outbox = floor.Outbox()
    taken: list[tuple[list[int], bool]] = []
    reader = threading.Thread(
        target=lambda: taken.append(outbox.take(time.perf_counter() + 60)), daemon=True
    )
    reader.start()
    while not outbox.waiting:  # the reader waits for a first token
        time.sleep(0.001)
    for token in range(1, 6):
        outbox.push(token, done=False)
    outbox.push(None, done=True)  # a stop: no token of its own
    reader.join(timeout=10)  # the finish ends the 60 s linger
    assert not reader.is_alive()
    assert taken == [([1, 2, 3, 4, 5], True)]


def test_a_reader_past_its_linger_takes_what_is_there_at_once() -> None:
    outbox = floor.Outbox()
    outbox.push(7, done=False)
    outbox.push(8, done=False)
    assert outbox.take(0.0) == ([7, 8], False)


def test_the_floor_server_streams_the_text_mlx_lm_generates(tmp_path: Path) -> None:
    throughput.use_documented_prompt(BUNDLED)
    direct = throughput.DirectRunner(BUNDLED)
    measured = direct.run(1, 64, 1)
    server = floor.start_floor(BUNDLED, floor.DEFAULT_LINGER_SECONDS, tmp_path / "floor.log")
    try:

        async def ask() -> throughput.StreamResult:
            with trio.fail_after(60):
                async with throughput.new_client(1) as client:
                    body = throughput.request_body(0, 64)
                    return await throughput.stream_one(client, server.base_url, body)

        result = trio.run(ask)
    finally:
        throughput.stop_server(server)
    assert result.terminal == "response.completed"
    assert result.text == measured.outputs[0]
    assert result.output_tokens == measured.tokens
