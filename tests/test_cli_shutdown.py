"""The installed console script: --help, environment variables, and a clean SIGTERM shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx2 as httpx
import trio

from mlx_responses.cli import SERVE_FLAGS, build_parser
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL
from .console import SCRIPT, serving

DEADLINE = 90


def test_help_documents_every_flag_and_its_environment_variable() -> None:
    out = subprocess.run(
        [str(SCRIPT), "serve", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for flag in SERVE_FLAGS:
        assert flag.name in out
        assert flag.env in out


def test_environment_sets_flags_and_command_line_wins() -> None:
    env = {"MLX_RESPONSES_PORT": "9191", "MLX_RESPONSES_ALIAS": "from-env"}
    args = build_parser(env).parse_args(["serve"])
    assert args.port == 9191
    assert args.alias == "from-env"
    args = build_parser(env).parse_args(["serve", "--port", "9292"])
    assert args.port == 9292


async def test_sigterm_ends_running_streams_with_a_terminal_event_and_exits_0(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "MLX_RESPONSES_PORT": "0",
        "MLX_RESPONSES_PREFILL_STEP_SIZE": "4",
        "MLX_RESPONSES_DATA_DIR": str(tmp_path),  # the default, durable store, in a fresh folder
    }
    with trio.fail_after(DEADLINE):
        async with serving(env) as (process, base_url):
            raw = b""
            async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
                async with http.stream(
                    "POST",
                    "/v1/responses",
                    # A long prompt prefilled 4 tokens a step is still running at the signal.
                    json={"model": MODEL, "input": "Reply with: hello. " * 150, "stream": True},
                ) as reply:
                    signalled = False
                    async for chunk in reply.aiter_bytes():
                        raw += chunk
                        if not signalled and b"response.in_progress" in raw:
                            process.send_signal(signal.SIGTERM)
                            signalled = True
            code = await process.wait()
    events = parse_sse(raw)
    final = assert_stream_invariants(events)
    assert events[-1][0] == "response.failed"
    assert final["error"]["code"] == "server_error"
    assert "shutting down" in final["error"]["message"]
    assert code == 0
    assert (tmp_path / "store.sqlite3").exists()
