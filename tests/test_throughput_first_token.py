"""``bench/throughput.py``'s first token per request: every turn of every stream gives its own
time to its first token on both sides (from its insertion into mlx-lm's batch, from its send
to the real server), pooled over the repeats, so one stream of four turns is judged on four
requests a repeat instead of its first one alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from .scripts_loader import bench_module

first_token = bench_module("first_token")
throughput = bench_module("throughput")

BUNDLED = str(throughput.ROOT / "src" / "engine" / "bundled")
DEADLINE = 120

seconds = st.floats(min_value=1e-4, max_value=1.0, allow_nan=False)
repeats = st.lists(st.lists(seconds, min_size=1, max_size=6), min_size=1, max_size=5)


def test_requests_are_pooled_over_the_repeats_and_paired_per_repeat() -> None:
    direct = [(0.004, 0.005, 0.006), (0.010, 0.010, 0.010)]
    server = [(0.008, 0.009, 0.020), (0.012, 0.013, 0.014)]
    stats = first_token.request_stats(direct, server)
    assert stats["requests"] == [6, 6]
    assert stats["direct_p50_ms"] == pytest.approx(8.0)  # (6 + 10) / 2
    assert stats["server_p50_ms"] == pytest.approx(12.5)
    assert stats["overhead_ms"] == pytest.approx(4.5)
    assert stats["paired_ms"] == [4.0, 3.0]  # 9 - 5, 13 - 10
    assert stats["overhead_paired_ms"] == pytest.approx(3.5)


@given(repeats)
def test_a_server_as_fast_as_direct_has_no_overhead(runs: list[list[float]]) -> None:
    stats = first_token.request_stats(runs, runs)
    assert stats["overhead_ms"] == pytest.approx(0.0, abs=1e-9)
    assert stats["overhead_paired_ms"] == pytest.approx(0.0, abs=1e-9)
    assert stats["requests"] == [sum(map(len, runs))] * 2


def test_the_printed_table_and_headline_show_the_requests_counted() -> None:
    stats = first_token.first_token_stats(
        [(0.004, 0.005)], [(0.009, 0.010)], [(0.004, 0.005)], [(0.009, 0.011)]
    )
    row = {
        "concurrency": 1,
        "first_token": stats,
        "paired_ratios": [1.0],
        "ratio": 1.0,
        "direct_tok_s": 100.0,
        "server_tok_s": 100.0,
    }
    lines = first_token.first_token_lines([row])
    assert "first token, ms from each request's send" in "\n".join(lines)
    assert lines[-1].split()[-1] == "2"  # two requests on the server's side
    assert "per request (2, every turn): direct 4.5 ms, server 10.0 ms" in first_token.headline(row)


def test_every_turn_of_a_stream_is_timed_on_both_sides(tmp_path: Path) -> None:
    throughput.use_documented_prompt(BUNDLED)
    direct = throughput.DirectRunner(BUNDLED).run(1, 8, 3)
    assert len(direct.request_first_s) == 3
    assert direct.request_first_s[0] == pytest.approx(direct.first_token_s[0])
    assert all(0 < s < direct.seconds for s in direct.request_first_s)

    async def ask(base_url: str) -> object:
        with trio.fail_after(DEADLINE):
            return await throughput.server_run(base_url, 1, 8, turns=3)

    command = throughput.default_server_command()
    with throughput.running_server(command, BUNDLED, tmp_path / "server.log") as server:
        measured = trio.run(ask, server.base_url)
    assert len(measured.request_first_s) == 3
    # The first request is sent after the run's start: its own time is the shorter.
    assert 0 < measured.request_first_s[0] <= measured.first_token_s[0]
    assert all(0 < s < measured.seconds for s in measured.request_first_s)
