"""An agent loop three ways (issue 14): WebSocket continuation against HTTP.

Run::

    .venv/bin/python bench/websocket.py [--turns 20] [--repeats 3] [--max-tokens 16]
        [--tool-output-words 15] [--model PATH] [--server-command CMD] [--no-http-stream]

One ``mlx-responses serve`` subprocess (the bench model from ``bench/make_bench_model.py`` by
default, random weights: every turn generates exactly ``--max-tokens``). A Codex-shaped loop of
``--turns`` tool round trips: a long instruction block first, then each turn sends a tool result
(``--tool-output-words`` words) as new input and reads the model's answer. Three ways, each
``--repeats`` times, interleaved so that machine noise falls on all of them alike:

- **websocket**: one ``client.responses.connect()`` socket, ``store: false``; each turn sends
  only the new item with ``previous_response_id`` (the connection keeps the history);
- **http-replay**: ``POST /v1/responses`` with ``store: false`` and the whole history every
  turn, streamed (``stream: true``, every event parsed: what Codex CLI does over HTTP);
- **http-chain**: ``POST /v1/responses`` with ``store: true`` and ``previous_response_id``,
  streamed too.

``--no-http-stream`` makes the HTTP ways plain JSON requests instead (the server then sends one
body per turn while the socket still sends every event).

Reported per way: end-to-end time of the loop (median over repeats), the bench's own CPU
seconds and the server's CPU seconds for the loop, and the ratio of each HTTP way's time to the
WebSocket's. With the prompt cache the model's work is the same for all three (each turn
prefills only what follows the cached history); what differs is what the client sends and the
server parses, stores, replays and tokenizes (a socket continuation tokenizes only its new
text, docs/websocket.md).

Figures are printed and written to ``bench/results/websocket-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (
    RESULTS_DIR,
    default_server_command,
    machine_facts,
    process_cpu,
    resolve_model,
    running_server,
)

INSTRUCTIONS = " ".join(f"Rule {i}: keep the answer short and exact." for i in range(25))


def tool_output(turn: int, words: int) -> str:
    return " ".join(f"line{turn}-{i}" for i in range(words))


def turn_input(turn: int, words: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Tool result {turn}: {tool_output(turn, words)}"}]


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": "bench", "max_output_tokens": args.max_tokens, "temperature": 0}


def run_websocket(base_url: str, args: argparse.Namespace) -> None:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=600)
    with client.responses.connect() as connection:
        previous: str | None = None
        for turn in range(args.turns):
            body: dict[str, Any] = {
                "type": "response.create",
                **settings(args),
                "store": False,
                "input": turn_input(turn, args.tool_output_words),
            }
            if previous is None:
                body["instructions"] = INSTRUCTIONS
            else:
                body["previous_response_id"] = previous
                body["instructions"] = INSTRUCTIONS
            connection.send(body)
            while True:
                event = json.loads(connection.recv_bytes())
                if event["type"] == "error":
                    raise RuntimeError(event)
                if event["type"] in ("response.completed", "response.incomplete"):
                    previous = event["response"]["id"]
                    break


def streamed(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """POST with ``stream: true``; every SSE event parsed (as the socket's client parses every
    frame); the terminal event's response."""
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] in ("response.completed", "response.incomplete"):
                return dict(event["response"])
            if event["type"] in ("response.failed", "error"):
                raise RuntimeError(event)
    raise RuntimeError("the stream ended without a terminal event")


def run_http(base_url: str, args: argparse.Namespace, *, chain: bool) -> None:
    history: list[dict[str, Any]] = []
    previous: str | None = None
    with httpx.Client(base_url=base_url, timeout=600) as http:
        for turn in range(args.turns):
            new = turn_input(turn, args.tool_output_words)
            body: dict[str, Any] = {**settings(args), "instructions": INSTRUCTIONS}
            if chain:
                body |= {"store": True, "input": new}
                if previous is not None:
                    body["previous_response_id"] = previous
            else:
                history += new
                body |= {"store": False, "input": history}
            if args.http_stream:
                data = streamed(http, body)
            else:
                reply = http.post("/v1/responses", json=body)
                reply.raise_for_status()
                data = reply.json()
            previous = data["id"]
            if not chain:
                history += data["output"]


WAYS = {
    "websocket": run_websocket,
    "http-replay": lambda url, args: run_http(url, args, chain=False),
    "http-chain": lambda url, args: run_http(url, args, chain=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--tool-output-words", type=int, default=15)
    parser.add_argument("--model", default=None)
    parser.add_argument("--server-command", default=None)
    parser.add_argument(
        "--http-stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the HTTP ways stream (stream: true, as Codex CLI does); --no-http-stream: JSON",
    )
    args = parser.parse_args()
    model = resolve_model(args.model)
    command = shlex.split(args.server_command) if args.server_command else default_server_command()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with running_server(command, model, RESULTS_DIR / f"websocket-{stamp}.log") as server:
        pid = server.process.pid
        run_http(server.base_url, argparse.Namespace(**{**vars(args), "turns": 2}), chain=False)
        for repeat in range(args.repeats):
            order = list(WAYS) if repeat % 2 == 0 else list(reversed(WAYS))
            for way in order:
                server_cpu, client_cpu = process_cpu(pid), time.process_time()
                started = time.perf_counter()
                WAYS[way](server.base_url, args)
                runs[way].append(
                    {
                        "seconds": time.perf_counter() - started,
                        "client_cpu_s": time.process_time() - client_cpu,
                        "server_cpu_s": process_cpu(pid) - server_cpu,
                    }
                )
                print(f"repeat {repeat} {way}: {runs[way][-1]['seconds']:.2f} s", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for way, samples in runs.items():
        summary[way] = {
            key: round(statistics.median(s[key] for s in samples), 3)
            for key in ("seconds", "client_cpu_s", "server_cpu_s")
        }
    ws = summary["websocket"]["seconds"]
    for way in ("http-replay", "http-chain"):
        summary[way]["time_vs_websocket"] = round(summary[way]["seconds"] / ws, 3)
    report = {
        "machine": machine_facts(),
        "model": model,
        "args": vars(args),
        "summary": summary,
        "runs": runs,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"websocket-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
