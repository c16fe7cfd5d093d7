"""Long agent sessions and the prompt cache's disk tier: a restart, and more agents than RAM.

On the bench model (``bench/make_bench_model.py``), each agent's history is one ~8k-token
prompt (instructions and a long tool output), and every figure is the server's time to first
token (the first ``.delta`` of a streamed ``/v1/responses``), measured in this run:

- **restart**: an agent's first turn on a fresh server (cold), a clean stop (SIGTERM: RAM
  reaches the disk), then its next turn on a new server over the same ``--prompt-cache-dir``.
  Ratio: first turn after the restart / cold.
- **interleaved**: 4 agents, one turn each in turn, then a second round, on a server whose
  ``--prompt-cache-bytes`` holds 2 of them: every second-round turn finds its agent evicted
  from RAM, so it is served from disk. Ratio: median second-round / median first-round (cold).

    .venv/bin/python bench/long_sessions.py [--tokens 8192] [--no-openblas]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2 as httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_loop import TextMaker, maps_openblas, maybe_reexec_with_openblas, ours_argv, spawn
from make_bench_model import make_bench_model
from throughput import ROOT, SseReader, free_port

RESULTS_DIR = ROOT / "bench" / "results"


def turn(base: str, instructions: str, items: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    """One streamed turn: (seconds to the first delta, the final response)."""
    import trio

    async def run() -> tuple[float, dict[str, Any]]:
        body = {"model": "bench", "instructions": instructions, "input": items, "store": False}
        body |= {"stream": True, "temperature": 0, "max_output_tokens": 8}
        start = time.perf_counter()
        first, final = 0.0, None
        async with httpx.AsyncClient(timeout=600) as client:
            async with client.stream("POST", base + "/v1/responses", json=body) as response:
                reader = SseReader(response)
                while (event := await reader.next_event()) is not None:
                    name, data = event
                    if not first and name.endswith(".delta"):
                        first = time.perf_counter() - start
                    if name in ("response.completed", "response.incomplete"):
                        final = data["response"]
        assert final is not None, "the turn failed"
        return first, final

    return trio.run(run)


def cached(response: dict[str, Any]) -> int:
    return int(response["usage"]["input_tokens_details"]["cached_tokens"])


def disk_stats(base: str) -> dict[str, Any]:
    with httpx.Client(timeout=10) as client:
        return dict(client.get(base + "/health").json()["prompt_cache"].get("disk") or {})


@contextlib.contextmanager
def server(model: str, folder: Path, logs: Path, name: str, *flags: str) -> Iterator[str]:
    port = free_port()
    argv = [*ours_argv(model, port), "--prompt-cache-dir", str(folder), *flags]
    base = f"http://127.0.0.1:{port}"
    with spawn(argv, logs / f"{name}.log", base) as process:
        print(f"  {name}: OpenBLAS mapped in the server: {maps_openblas(process.process.pid)}")
        turn(base, "warm up", [{"role": "user", "content": "hi"}])  # a first step's set-up
        yield base


class Agent:
    def __init__(self, number: int, maker: TextMaker, tokens: int) -> None:
        self.instructions = f"You are agent {number}. Use the shell tool."
        self.items: list[dict[str, Any]] = [
            {"role": "user", "content": f"Agent {number}: " + maker.text(tokens)}
        ]

    def reply(self, response: dict[str, Any], text: str) -> None:
        """The next turn's input: the reply replayed, and a short new user message."""
        self.items.extend(response["output"])
        self.items.append({"role": "user", "content": text})


def restart(model: str, maker: TextMaker, tokens: int, logs: Path) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="long-sessions-"))
    agent = Agent(0, maker, tokens)
    try:
        with server(model, folder, logs, "restart-1") as base:
            cold, response = turn(base, agent.instructions, agent.items)
        agent.reply(response, "Go on.")
        with server(model, folder, logs, "restart-2") as base:
            again, response = turn(base, agent.instructions, agent.items)
            disk = disk_stats(base)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "prompt_tokens": response["usage"]["input_tokens"],
        "cached_tokens": cached(response),
        "cold_ttft_s": round(cold, 3),
        "after_restart_ttft_s": round(again, 3),
        "ratio": round(again / cold, 3),
        "disk_hits": disk.get("hits"),
    }


def interleaved(model: str, maker: TextMaker, tokens: int, logs: Path) -> dict[str, Any]:
    config = json.loads((Path(model) / "config.json").read_text())
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * 4
    per_token *= config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    ram = int(per_token * (tokens + 300) * 2.5)  # two agents' entries, not three
    folder = Path(tempfile.mkdtemp(prefix="long-sessions-"))
    agents = [Agent(n + 1, maker, tokens) for n in range(4)]
    colds: list[float] = []
    warm: list[float] = []
    hits: list[int] = []
    try:
        with server(model, folder, logs, "interleaved", "--prompt-cache-bytes", str(ram)) as base:
            for agent in agents:
                seconds, response = turn(base, agent.instructions, agent.items)
                colds.append(seconds)
                agent.reply(response, "Next step.")
            for agent in agents:
                seconds, response = turn(base, agent.instructions, agent.items)
                warm.append(seconds)
                hits.append(cached(response))
            disk = disk_stats(base)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "prompt_cache_bytes": ram,
        "cold_ttft_s": [round(s, 3) for s in colds],
        "from_disk_ttft_s": [round(s, 3) for s in warm],
        "cached_tokens": hits,
        "ratio": round(statistics.median(warm) / statistics.median(colds), 3),
        "disk_hits": disk.get("hits"),
        "disk_writes": disk.get("writes"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="each agent's history")
    parser.add_argument("--no-openblas", action="store_true")
    args = parser.parse_args(argv)
    maybe_reexec_with_openblas(args.no_openblas)
    print(f"OpenBLAS mapped in the bench process: {maps_openblas()}")
    model = str(make_bench_model())
    from mlx_lm import load

    maker = TextMaker(load(model)[1], seed=7)
    logs = RESULTS_DIR / "long_sessions"
    result = {
        "restart": restart(model, maker, args.tokens, logs),
        "interleaved": interleaved(model, maker, args.tokens, logs),
    }
    print(json.dumps(result, indent=2))
    print(
        f"first turn after a restart: {result['restart']['ratio']}x cold (target <= 0.15); "
        f"turns served from disk: {result['interleaved']['ratio']}x cold (target <= 0.25)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
