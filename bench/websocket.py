"""An agent loop three ways (issue 14): WebSocket continuation against HTTP.

Run::

    .venv/bin/python bench/websocket.py [--turns 20] [--repeats 3] [--max-tokens 16]
        [--workload codex|small] [--instructions-tokens 2000] [--item-tokens 300,600]
        [--tool-output-words 15] [--ctx-size N] [--ways websocket,http-replay,http-chain]
        [--ws-send sdk|raw]
        [--model PATH] [--server-command CMD] [--no-http-stream]

One ``mlx-responses serve`` subprocess (the bench model from ``bench/make_bench_model.py`` by
default, random weights: every turn generates exactly ``--max-tokens``; ``--model
src/engine/bundled`` for the tiny model, where the server's own per-turn work shows). A loop of
``--turns`` tool round trips, two workloads:

- ``--workload codex`` (the default): Codex-shaped, as ``bench/agent_loop.py``: an instruction
  block of ``--instructions-tokens`` tokens and four Codex tool definitions (``shell``,
  ``apply_patch``, ``update_plan``, ``view_image``), a task as the first user message, then
  each turn a ``function_call`` (``shell``) and its ``function_call_output`` of
  ``--item-tokens`` tokens (drawn per turn) as the new input; a tool call the model made itself
  is answered ``ok``. Every run's conversation is its own (a run number in the task), so the
  prefix cache shares only the instructions and tools across runs, as across Codex sessions.
  The context window is ``--ctx-size`` (default 16384, enough for 20 turns of 600 tokens).
- ``--workload small`` (the earlier bench): a short instruction block, then each turn a user
  message with a tool result of ``--tool-output-words`` words.

Three ways, each ``--repeats`` times, interleaved so that machine noise falls on all of them
alike (``--ways`` runs a subset, e.g. one way under a profiler):

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
import copy
import json
import math
import random
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

SMALL_INSTRUCTIONS = " ".join(f"Rule {i}: keep the answer short and exact." for i in range(25))

# Codex CLI's own tools, as it declares them (descriptions shortened).
CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output. Always set workdir.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string", "description": "The working directory."},
                "timeout_ms": {"type": "number", "description": "The timeout in ms."},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Use the apply_patch tool to edit files: a patch in the V4A diff format.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The patch."}},
            "required": ["input"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "update_plan",
        "description": "Updates the task plan: a list of steps, each with a status.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "explanation": {"type": "string"},
                "plan": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": {"type": "string"},
                            "status": {"type": "string"},
                        },
                        "required": ["step", "status"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["plan"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "view_image",
        "description": "Attach a local image (by filesystem path) to the conversation.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "The image's path."}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
]
WORDS = (
    "the file parser returns error when config value missing so we check path and retry build "
    "test module function class import list dict string number value index update patch diff "
    "commit branch merge request response stream token cache prefix model server client agent "
    "shell command output line write read open close run step loop batch queue"
).split()


class Workload:
    """One loop's fixed parts: instructions, tools, and each turn's new input (a run number
    makes each run's conversation its own)."""

    def __init__(self, args: argparse.Namespace, model: str) -> None:
        self.args = args
        self.turns: int = args.turns
        self.tools: list[dict[str, Any]] = []
        self.outputs: list[str] = []
        if args.workload == "small":
            self.instructions = SMALL_INSTRUCTIONS
            return
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
        rng = random.Random(11)

        def text(tokens: int) -> str:
            words: list[str] = []
            while len(tokenizer.encode(" ".join(words)).ids) < tokens:
                words.extend(rng.choice(WORDS) for _ in range(16))
            while len(words) > 1 and len(tokenizer.encode(" ".join(words[:-1])).ids) >= tokens:
                words.pop()
            return " ".join(words)

        low, high = args.item_tokens
        self.instructions = "You are a coding agent. " + text(args.instructions_tokens)
        self.tools = CODEX_TOOLS
        self.outputs = [text(rng.randint(low, high)) for _ in range(args.turns)]

    def turn_input(self, run: int, turn: int) -> list[dict[str, Any]]:
        if self.args.workload == "small":
            words = self.args.tool_output_words
            output = " ".join(f"line{turn}-{i}" for i in range(words))
            return [{"role": "user", "content": f"Tool result {turn}: {output}"}]
        items: list[dict[str, Any]] = []
        if turn == 0:
            task = f"Task {run}: fix the failing test in the parser and run the suite."
            items.append({"type": "message", "role": "user", "content": task})
        call_id = f"call_{run}_{turn}"
        arguments = json.dumps({"command": ["bash", "-lc", f"cat notes/{run}-{turn}.txt"]})
        items.append(
            {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": arguments}
        )
        items.append(
            {"type": "function_call_output", "call_id": call_id, "output": self.outputs[turn]}
        )
        return items

    def settings(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "bench",
            "max_output_tokens": self.args.max_tokens,
            "temperature": 0,
            "instructions": self.instructions,
        }
        if self.tools:
            body["tools"] = self.tools
        return body


def answers(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's answers to the tool calls the model made itself."""
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}
        for item in output
        if item.get("type") == "function_call"
    ]


Turns = list[dict[str, float]]


def turn_record(started: float, created: float, response: dict[str, Any]) -> dict[str, float]:
    """One turn's time, the time to its ``response.created`` event (the server's work before
    the model's: parsing, history, render, tokenizing, admission; NaN for a JSON request), and
    the model's work (what the prompt cache left to prefill)."""
    usage = response.get("usage") or {}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "seconds": time.perf_counter() - started,
        "created_s": created - started,
        "input_tokens": usage.get("input_tokens", 0),
        "cached_tokens": cached,
        "output_tokens": usage.get("output_tokens", 0),
    }


def run_websocket(base_url: str, work: Workload, run: int) -> Turns:
    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=600)
    turns: Turns = []
    with client.responses.connect() as connection:
        previous: str | None = None
        pending: list[dict[str, Any]] = []
        for turn in range(work.turns):
            started, created = time.perf_counter(), math.nan
            body: dict[str, Any] = {
                "type": "response.create",
                **work.settings(),
                "store": False,
                "input": pending + work.turn_input(run, turn),
            }
            if previous is not None:
                body["previous_response_id"] = previous
            if work.args.ws_send == "raw":
                connection.send_raw(json.dumps(body))  # serialised as Codex CLI does (serde)
            else:
                connection.send(body)  # the SDK's send: maybe_transform, then json.dumps
            while True:
                event = json.loads(connection.recv_bytes())
                if event["type"] == "error":
                    raise RuntimeError(event)
                if event["type"] == "response.created":
                    created = time.perf_counter()
                if event["type"] in ("response.completed", "response.incomplete"):
                    previous = event["response"]["id"]
                    pending = answers(event["response"]["output"])
                    turns.append(turn_record(started, created, event["response"]))
                    break
    return turns


def streamed(http: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """POST with ``stream: true``; every SSE event parsed (as the socket's client parses every
    frame); the terminal event's response, and when ``response.created`` came."""
    created = math.nan
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.created":
                created = time.perf_counter()
            if event["type"] in ("response.completed", "response.incomplete"):
                return dict(event["response"]), created
            if event["type"] in ("response.failed", "error"):
                raise RuntimeError(event)
    raise RuntimeError("the stream ended without a terminal event")


def run_http(base_url: str, work: Workload, run: int, *, chain: bool) -> Turns:
    args = work.args
    history: list[dict[str, Any]] = []
    previous: str | None = None
    pending: list[dict[str, Any]] = []
    turns: Turns = []
    with httpx.Client(base_url=base_url, timeout=600) as http:
        for turn in range(work.turns):
            started = time.perf_counter()
            new = pending + work.turn_input(run, turn)
            body: dict[str, Any] = work.settings()
            if chain:
                body |= {"store": True, "input": new}
                if previous is not None:
                    body["previous_response_id"] = previous
            else:
                history += new
                body |= {"store": False, "input": history}
            created = math.nan
            if args.http_stream:
                data, created = streamed(http, body)
            else:
                reply = http.post("/v1/responses", json=body)
                reply.raise_for_status()
                data = reply.json()
            previous = data["id"]
            pending = answers(data["output"])
            turns.append(turn_record(started, created, data))
            if not chain:
                history += data["output"]
    return turns


WAYS = {
    "websocket": run_websocket,
    "http-replay": lambda url, work, run: run_http(url, work, run, chain=False),
    "http-chain": lambda url, work, run: run_http(url, work, run, chain=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--workload", choices=("codex", "small"), default="codex")
    parser.add_argument("--instructions-tokens", type=int, default=2000)
    parser.add_argument(
        "--item-tokens",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=(300, 600),
        help="low,high tokens of each tool output (codex workload)",
    )
    parser.add_argument("--tool-output-words", type=int, default=15, help="small workload")
    parser.add_argument("--ctx-size", type=int, default=None, help="default 16384 for codex")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated subset")
    parser.add_argument(
        "--ws-send",
        choices=("sdk", "raw"),
        default="sdk",
        help="the socket's client events through the SDK's send (its type transform) or as "
        "plain json.dumps text (send_raw, as a client with its own serialiser)",
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--server-command", default=None)
    parser.add_argument(
        "--http-stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the HTTP ways stream (stream: true, as Codex CLI does); --no-http-stream: JSON",
    )
    args = parser.parse_args()
    ways = [way for way in args.ways.split(",") if way]
    if unknown := set(ways) - set(WAYS):
        parser.error(f"unknown ways: {sorted(unknown)}")
    if args.ctx_size is None and args.workload == "codex":
        args.ctx_size = 16384
    model = resolve_model(args.model)
    command = shlex.split(args.server_command) if args.server_command else default_server_command()
    extra = ["--ctx-size", str(args.ctx_size)] if args.ctx_size else []
    work = Workload(args, model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
    log_path = RESULTS_DIR / f"websocket-{stamp}.log"
    with running_server(command, model, log_path, extra_args=extra) as server:
        pid = server.process.pid
        warm = copy.copy(work)
        warm.turns = 2
        run_http(server.base_url, warm, -1, chain=False)
        run = 0
        for repeat in range(args.repeats):
            order = ways if repeat % 2 == 0 else list(reversed(ways))
            for way in order:
                server_cpu, client_cpu = process_cpu(pid), time.process_time()
                started = time.perf_counter()
                turns = WAYS[way](server.base_url, work, run)
                run += 1
                runs[way].append(
                    {
                        "seconds": time.perf_counter() - started,
                        "client_cpu_s": time.process_time() - client_cpu,
                        "server_cpu_s": process_cpu(pid) - server_cpu,
                        "prefilled_tokens": sum(
                            t["input_tokens"] - t["cached_tokens"] for t in turns
                        ),
                        "output_tokens": sum(t["output_tokens"] for t in turns),
                        "to_created_ms_per_turn": 1000
                        * statistics.fmean(t["created_s"] for t in turns),
                        "turns": turns,
                    }
                )
                print(f"repeat {repeat} {way}: {runs[way][-1]['seconds']:.2f} s", flush=True)
    summary: dict[str, dict[str, float]] = {}
    for way, samples in runs.items():
        summary[way] = {
            key: round(statistics.median(s[key] for s in samples), 3)
            for key in (
                "seconds",
                "client_cpu_s",
                "server_cpu_s",
                "prefilled_tokens",
                "output_tokens",
                "to_created_ms_per_turn",
            )
        }
    if "websocket" in summary:
        ws = summary["websocket"]["seconds"]
        for way in summary.keys() - {"websocket"}:
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
