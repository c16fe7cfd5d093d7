"""A rank that dies is loud and bounded (issue 26): SIGKILL of rank 1 mid-stream ends the stream
``response.failed`` with ``server_error``, rank 0 exits non-zero naming rank 1, and no rank is
left running. A rank that stops answering (SIGSTOP) stops the server the same way once
``--rank-timeout-secs`` has passed."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx2 as httpx
import pytest
import trio

from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH, load_bundled_prompts
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL
from .sharded import start_ranks

DEADLINE = 120
# Bounds the tests give the server (--rank-timeout-secs) and the exit after a fault.
RANK_TIMEOUT = 3
EXIT_SECONDS = 30
COUNT = next(p for p in load_bundled_prompts() if p.name == "count")


def _body() -> dict[str, object]:
    messages = [{"role": m["role"], "content": m["content"]} for m in COUNT.messages]
    return {"model": MODEL, "input": messages, "temperature": 0, "stream": True}


async def _stream_with_fault(base_url: str, fault: signal.Signals, pid: int) -> bytes:
    """Stream the long answer, sending ``fault`` to ``pid`` mid-decode; the whole stream."""
    raw = b""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        async with http.stream("POST", "/v1/responses", json=_body()) as reply:
            async for chunk in reply.aiter_bytes():
                raw += chunk
                if raw.count(b"event: response.output_text.delta") >= 10 and pid:
                    os.kill(pid, fault)
                    pid = 0
    return raw


async def test_sigkill_of_rank_1_fails_the_stream_and_stops_every_rank(tmp_path: Path) -> None:
    ranks = start_ranks(
        BUNDLED_MODEL_PATH, tmp_path, "--alias", MODEL, "--rank-timeout-secs", str(RANK_TIMEOUT)
    )
    try:
        with trio.fail_after(DEADLINE):
            raw = await _stream_with_fault(ranks.base_url, signal.SIGKILL, ranks.processes[1].pid)
        codes = ranks.wait(EXIT_SECONDS)
    finally:
        ranks.close()
    assert codes[1] == -signal.SIGKILL
    assert codes[0] == 1, ranks.log(0)
    # The lost connection, or the silence that comes first on a loaded machine, names rank 1.
    assert re.search(r"the sharded model stopped: .*rank 1", ranks.log(0)), ranks.log(0)
    events = parse_sse(raw)
    final = assert_stream_invariants(events)
    assert events[-1][0] == "response.failed"
    assert final["error"]["code"] == "server_error"
    assert all(process.poll() is not None for process in ranks.processes)


async def test_a_rank_that_stops_answering_stops_the_server_within_the_bound(
    tmp_path: Path,
) -> None:
    ranks = start_ranks(
        BUNDLED_MODEL_PATH, tmp_path, "--alias", MODEL, "--rank-timeout-secs", str(RANK_TIMEOUT)
    )
    follower = ranks.processes[1]
    try:
        with trio.fail_after(DEADLINE):
            raw = await _stream_with_fault(ranks.base_url, signal.SIGSTOP, follower.pid)
        code = ranks.processes[0].wait(EXIT_SECONDS)
        follower.send_signal(signal.SIGCONT)  # it finds rank 0 gone and exits too
        follower_code = follower.wait(EXIT_SECONDS)
    finally:
        ranks.close()
    assert code == 1, ranks.log(0)
    assert f"rank 1 did not answer within {RANK_TIMEOUT} s" in ranks.log(0)
    events = parse_sse(raw)
    final = assert_stream_invariants(events)
    assert events[-1][0] == "response.failed"
    assert final["error"]["code"] == "server_error"
    assert follower_code == 1, ranks.log(1)
    # Once it runs again it finds rank 0 gone (or, first, too late to answer).
    assert re.search(r"rank 1 stopped: .*rank 0", ranks.log(1)), ranks.log(1)


def test_a_model_that_cannot_be_split_by_layers_is_refused_by_name(tmp_path: Path) -> None:
    # The bundled model's class (qwen3) has no pipeline split in mlx-lm: start-up stops.
    with pytest.raises(AssertionError) as refused:
        start_ranks(BUNDLED_MODEL_PATH, tmp_path, "--pipeline")
    message = str(refused.value)
    assert "did not start" in message
    assert "mlx_lm.models.qwen3 cannot be split by layers (pipeline)" in message
    assert "leave out --pipeline" in message


def test_pipeline_without_several_ranks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLX_RANK", raising=False)  # not started by mlx.launch
    expected = re.escape("--pipeline needs several ranks: start with mlx.launch")
    with pytest.raises(SystemExit, match=expected):
        settings_from_args(build_parser({}).parse_args(["serve", "--pipeline"]))
