"""A Codex-shaped agent loop: time to first token per turn, ours against mlx_lm.server and cold.

Run::

    .venv/bin/python bench/agent_loop.py [--model PATH] [--turns 10] [--agents 4]
        [--instructions-tokens 2000] [--item-tokens 300,600] [--output-tokens 32]
        [--cold-turns 1,5,10] [--order ours,peer] [--agent-counts 1,4]
        [--ours-args "--prefill-step-size 2048"] [--no-openblas] [--skip-peer]
        [--server-command CMD] [--base-command CMD --order ours,base,ours,base]

Each turn resends the whole history with ``store: false`` (as Codex CLI does): an instruction
block, then user messages and ``function_call`` / ``function_call_output`` pairs of
``--item-tokens`` tokens each, alternating, and the server's own previous outputs replayed as it
returned them. Per turn it measures the time to the first streamed delta, the prompt tokens and
the cached tokens the server reports.

Three measurements in one run, on the same model and the same conversations:

1. **ours**: ``mlx-responses serve`` (``/v1/responses``, streamed);
2. **peer**: ``python -m mlx_lm server`` with its default prompt cache (``/v1/chat/completions``,
   streamed with ``stream_options.include_usage``), the history sent as chat messages;
3. **cold**: the same turn's prompt (rendered with the chat template as the peer gets it)
   prefilled directly through mlx-lm's ``BatchGenerator`` in this process, with no cache, to
   its first token: what a turn costs with no prompt cache at all.

Then both servers again with ``--agents`` conversations interleaved (all agents send turn k
together). With OpenBLAS installed (Debian ``libopenblas0-pthread``) it is preloaded into this
process and both servers unless ``--no-openblas``; the report says whether it was mapped.
Results are printed and written to ``bench/results/agent-loop-<timestamp>.json``.

Side by side against another build: ``--base-command`` starts a second ``mlx-responses`` (e.g.
an older commit's venv script; the part before ``serve``), run as the kind ``base`` with the
same flags as ours. ``--order`` may name a kind more than once, so ``ours,base,ours,base``
alternates the two in one invocation (the machine's drift lands on both); the report then
gives each run's wall time and median TTFT of turns 2 on, and ours over base.

Every server starts with an empty prompt-cache disk tier of its own (``--prompt-cache-dir`` in a
fresh temporary folder): the disk tier outlives a server, and the runs send the same
conversations, so a shared one would let each server reuse its predecessors' prefixes (measured:
the first server of an invocation, the only one that found the default folder empty, took 18 s
for the ten turns the others took 5.4-5.9 s for).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_bench_model import make_bench_model
from throughput import (
    ROOT,
    ServerProcess,
    SseReader,
    default_server_command,
    free_port,
    stop_server,
    wait_ready,
)

RESULTS_DIR = ROOT / "bench" / "results"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
OPENBLAS_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib")
WORDS = (
    "the file parser returns error when config value missing so we check path and retry build "
    "test module function class import list dict string number value index update patch diff "
    "commit branch merge request response stream token cache prefix model server client agent "
    "shell command output line write read open close run step loop batch queue"
).split()


# -- OpenBLAS ------------------------------------------------------------------------------------


def find_openblas() -> str | None:
    for folder in OPENBLAS_DIRS:
        path = Path(folder) / "libopenblas.so.0"
        if path.exists():
            return str(path)
    return None


def maybe_reexec_with_openblas(disabled: bool) -> None:
    """Preload OpenBLAS (before MLX loads) by re-executing with LD_PRELOAD; children inherit."""
    library = find_openblas()
    if disabled or library is None or "libopenblas" in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ, LD_PRELOAD=library)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def maps_openblas(pid: int | str = "self") -> bool:
    try:
        return "libopenblas" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


# -- the workload --------------------------------------------------------------------------------


class TextMaker:
    """Deterministic filler text of about N tokens of the model's tokenizer."""

    def __init__(self, tokenizer: Any, seed: int) -> None:
        self._tokenizer = tokenizer
        self._random = random.Random(seed)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def text(self, tokens: int) -> str:
        words: list[str] = []
        # Grow in chunks, then trim word by word: counting is the slow part.
        while True:
            words.extend(self._random.choice(WORDS) for _ in range(32))
            if self.count(" ".join(words)) >= tokens:
                break
        while len(words) > 1 and self.count(" ".join(words[:-1])) >= tokens:
            words.pop()
        return " ".join(words)


@dataclass(slots=True)
class Conversation:
    """One agent's history in both dialects: Responses input items and chat messages."""

    instructions: str
    items: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    # The chat messages as they stood when each turn was sent (for the cold reference).
    sent: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.messages.append({"role": "system", "content": self.instructions})

    def add_turn_input(self, agent: int, turn: int, maker: TextMaker, size: int) -> None:
        if turn % 2 == 1:
            text = f"Agent {agent}, turn {turn}: " + maker.text(size)
            self.items.append({"type": "message", "role": "user", "content": text})
            self.messages.append({"role": "user", "content": text})
            return
        call_id = f"call_{agent}_{turn}"
        arguments = json.dumps({"command": ["bash", "-lc", f"cat notes/{agent}-{turn}.txt"]})
        output = maker.text(size)
        self.items.append(
            {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": arguments}
        )
        self.items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        self.messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "shell", "arguments": arguments},
                    }
                ],
            }
        )
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})


def build_inputs(args: argparse.Namespace, maker: TextMaker) -> tuple[str, list[list[int]]]:
    """The shared instruction block and each agent's per-turn input sizes."""
    instructions = "You are a coding agent. " + maker.text(args.instructions_tokens)
    low, high = args.item_tokens
    rng = random.Random(7)
    sizes = [[rng.randint(low, high) for _ in range(args.turns)] for _ in range(args.agents)]
    return instructions, sizes


# -- measuring one turn --------------------------------------------------------------------------


@dataclass(slots=True)
class Turn:
    turn: int
    agent: int
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    text: str = ""

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens


async def ours_turn(
    client: httpx.AsyncClient, base: str, conv: Conversation, args: argparse.Namespace
) -> tuple[float, float, dict[str, Any]]:
    body = {
        "model": "bench",
        "instructions": conv.instructions,
        "input": conv.items,
        "store": False,
        "stream": True,
        "temperature": 0,
        "max_output_tokens": args.output_tokens,
        "prompt_cache_key": "agent-loop",
    }
    start = time.perf_counter()
    first = 0.0
    final: dict[str, Any] | None = None
    async with client.stream("POST", base + "/v1/responses", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"ours: HTTP {response.status_code}: {await response.aread()!r}")
        reader = SseReader(response)
        while (event := await reader.next_event()) is not None:
            name, data = event
            if not first and name.endswith(".delta"):
                first = time.perf_counter() - start
            if name in ("response.completed", "response.incomplete", "response.failed"):
                final = data["response"]
    if final is None or final.get("status") == "failed":
        raise RuntimeError(f"ours: the turn failed: {final}")
    return first, time.perf_counter() - start, final


def replay_ours(conv: Conversation, response: dict[str, Any], maker: TextMaker) -> str:
    text = ""
    for item in response["output"]:
        conv.items.append(item)
        if item["type"] == "message":
            text += "".join(part.get("text", "") for part in item["content"])
        elif item["type"] == "function_call":
            # The random model called a tool: answer it, as the agent would.
            conv.items.append(
                {"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}
            )
    return text


async def peer_turn(
    client: httpx.AsyncClient, base: str, conv: Conversation, args: argparse.Namespace
) -> tuple[float, float, str, dict[str, Any]]:
    body = {
        "model": args.model_path,
        "messages": conv.messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": args.output_tokens,
    }
    start = time.perf_counter()
    first = 0.0
    parts: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"peer: HTTP {response.status_code}: {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning") or ""
                if piece or delta.get("tool_calls"):
                    first = first or time.perf_counter() - start
                parts.append(delta.get("content") or "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    return first, time.perf_counter() - start, "".join(parts), usage


async def run_loop(
    kind: str,
    base: str,
    instructions: str,
    sizes: list[list[int]],
    agents: int,
    args: argparse.Namespace,
    maker: TextMaker,
    record: list[Turn],
    convs_out: list[Conversation] | None = None,
) -> float:
    convs = [Conversation(instructions) for _ in range(agents)]
    limits = httpx.Limits(max_connections=agents + 2)
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        for turn in range(1, args.turns + 1):
            for a, conv in enumerate(convs):
                conv.add_turn_input(a, turn, maker, sizes[a][turn - 1])

            async def one(a: int, turn: int = turn) -> None:
                conv = convs[a]
                conv.sent[turn] = list(conv.messages)
                if kind != "peer":  # ours, or another build of it (base)
                    ttft, total, response = await ours_turn(client, base, conv, args)
                    usage = response["usage"]
                    cached = usage["input_tokens_details"]["cached_tokens"]
                    text = replay_ours(conv, response, maker)
                    conv.messages.append({"role": "assistant", "content": text})
                    record.append(Turn(turn, a, ttft, total, usage["input_tokens"], cached, text))
                else:
                    ttft, total, text, usage = await peer_turn(client, base, conv, args)
                    conv.messages.append({"role": "assistant", "content": text})
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    record.append(
                        Turn(turn, a, ttft, total, usage.get("prompt_tokens", 0), cached, text)
                    )

            async with trio.open_nursery() as nursery:
                for a in range(agents):
                    nursery.start_soon(one, a)
    if convs_out is not None:
        convs_out.extend(convs)
    return time.perf_counter() - start


# -- servers -------------------------------------------------------------------------------------


@contextlib.contextmanager
def spawn(
    argv: Sequence[str], log_path: Path, base: str, *, quiet_exit: bool = False
) -> Iterator[ServerProcess]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = ServerProcess(base, process, log_path)
    try:
        wait_ready(server, 180.0)
        yield server
    finally:
        if quiet_exit and process.poll() is None:
            # mlx_lm.server exits non-zero on SIGTERM: not worth a warning.
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        else:
            stop_server(server)


def ours_argv(model: str, port: int, command: Sequence[str] | None = None) -> list[str]:
    return [
        *(command or default_server_command()),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        "--alias",
        "bench",
        "--log-level",
        "warning",
        # The bench model's config says 4,096; its random weights do not care, and a long
        # agent loop goes past it (mlx_lm.server enforces no window).
        "--ctx-size",
        "32768",
    ]


def peer_argv(model: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlx_lm",
        "server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def health_prompt_cache(base: str) -> dict[str, Any] | None:
    with httpx.Client(timeout=10) as client:
        stats: dict[str, Any] | None = client.get(base + "/health").json().get("prompt_cache")
    return stats


# -- cold direct prefill -------------------------------------------------------------------------


class Cold:
    """Time to the first token of a prompt prefilled from nothing through BatchGenerator."""

    def __init__(self, model_path: str) -> None:
        import mlx.core as mx
        from mlx_lm import load
        from mlx_lm.generate import make_stop_sequences

        self.mx = mx
        self.model, self.tokenizer = load(model_path)[:2]
        self.stop = make_stop_sequences(self.tokenizer)
        self.stream = mx.new_stream(mx.default_device())

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        return [
            int(t)
            for t in self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        ]

    def ttft(self, prompt: list[int]) -> float:
        from mlx_lm.generate import BatchGenerator
        from mlx_lm.sample_utils import make_sampler

        generator = BatchGenerator(
            self.model, prefill_step_size=512, completion_batch_size=32, stream=self.stream
        )
        try:
            start = time.perf_counter()
            generator.insert(
                [prompt],
                max_tokens=[1],
                samplers=[make_sampler(temp=0.0)],
                stop_sequences=[self.stop],
            )
            while True:
                _, responses = generator.next()
                if responses:
                    return time.perf_counter() - start
        finally:
            generator.close()


# -- report --------------------------------------------------------------------------------------


def by_turn(turns: list[Turn]) -> dict[int, list[Turn]]:
    out: dict[int, list[Turn]] = {}
    for t in turns:
        out.setdefault(t.turn, []).append(t)
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def reuse_share(turns: list[Turn], previous_prompts: dict[tuple[int, int], int]) -> float:
    """Cached tokens over the replayed prefix (the previous turn's prompt plus its output),
    turns 2 onward."""
    shares = []
    for t in turns:
        replayed = previous_prompts.get((t.agent, t.turn - 1))
        if replayed:
            shares.append(min(1.0, t.cached_tokens / replayed))
    return sum(shares) / len(shares) if shares else float("nan")


def replayed_prefix(turns: list[Turn], output_tokens: int) -> dict[tuple[int, int], int]:
    return {(t.agent, t.turn): t.prompt_tokens + output_tokens for t in turns}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--instructions-tokens", type=int, default=2000)
    parser.add_argument(
        "--item-tokens", type=lambda s: tuple(int(x) for x in s.split(",")), default=(300, 600)
    )
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument(
        "--cold-turns", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 5, 10]
    )
    parser.add_argument(
        "--order",
        type=lambda s: [x for x in s.split(",") if x in ("ours", "peer", "base")],
        default=["ours", "peer"],
        help="which servers run, in this order (flip it to see the machine's drift); a kind "
        "may repeat: ours,base,ours,base alternates ours with --base-command",
    )
    parser.add_argument(
        "--agent-counts",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=None,
        help="agent counts to run (default: 1 and --agents)",
    )
    parser.add_argument(
        "--ours-args", default="", help="extra flags for mlx-responses serve (one string)"
    )
    parser.add_argument(
        "--server-command",
        default=None,
        help="command that starts ours, before 'serve' (default: the mlx-responses script "
        "next to this Python)",
    )
    parser.add_argument(
        "--base-command",
        default=None,
        help="command that starts the kind 'base' (another build of mlx-responses), before "
        "'serve'; e.g. /work/wt/base/.venv/bin/mlx-responses",
    )
    parser.add_argument("--no-openblas", action="store_true")
    parser.add_argument("--skip-peer", action="store_true")
    args = parser.parse_args(argv)
    if "base" in args.order and not args.base_command:
        parser.error("--order names 'base' but --base-command is not given")
    maybe_reexec_with_openblas(args.no_openblas)
    if args.agent_counts is None:
        args.agent_counts = sorted({1, args.agents})

    model = args.model or str(make_bench_model())
    args.model_path = model
    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(
        f"agent loop: model={model} turns={args.turns} agents={args.agents} "
        f"instructions={args.instructions_tokens} items={args.item_tokens} "
        f"output={args.output_tokens} cold_turns={args.cold_turns}"
    )

    cold = Cold(model)
    print(f"OpenBLAS mapped in the bench process: {maps_openblas()}")
    maker = TextMaker(cold.tokenizer, seed=11)
    instructions, sizes = build_inputs(args, maker)
    results: dict[str, Any] = {"parameters": {k: v for k, v in vars(args).items()}}
    blas: dict[str, bool] = {"bench": maps_openblas()}

    runs: dict[str, dict[str, Any]] = {}
    kinds = [k for k in args.order if not (args.skip_peer and k == "peer")]
    single_convs: list[Conversation] = []
    commands = {
        "ours": shlex.split(args.server_command) if args.server_command else None,
        "base": shlex.split(args.base_command) if args.base_command else None,
    }
    seen: dict[str, int] = {}
    for kind in kinds:
        seen[kind] = seen.get(kind, 0) + 1
        for agents in args.agent_counts:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            argv_ = (
                peer_argv(model, port)
                if kind == "peer"
                else [*ours_argv(model, port, commands[kind]), *shlex.split(args.ours_args)]
            )
            # A repeated kind's later runs are named ``ours-4-r2`` and so on.
            name = f"{kind}-{agents}" + (f"-r{seen[kind]}" if seen[kind] > 1 else "")
            log = RESULTS_DIR / f"agent-loop-{stamp}-{name}.log"
            record: list[Turn] = []
            disk = tempfile.TemporaryDirectory(prefix="agent-loop-cache-")
            if kind != "peer":  # a disk tier of its own, empty (the module's docstring)
                argv_ = [*argv_, "--prompt-cache-dir", disk.name]
            with disk, spawn(argv_, log, base, quiet_exit=kind == "peer") as server:
                blas[kind] = maps_openblas(server.process.pid)
                # The same filler text for every run: a fresh maker with the same seed.
                run_maker = TextMaker(cold.tokenizer, seed=23)
                keep = single_convs if (name == "ours-1") else None
                wall = trio.run(
                    run_loop,
                    kind,
                    base,
                    instructions,
                    sizes,
                    agents,
                    args,
                    run_maker,
                    record,
                    keep,
                )
                cache_stats = health_prompt_cache(base) if kind != "peer" else None
            runs[name] = {
                "wall_s": wall,
                "turns": [asdict(t) for t in record],
                "prompt_cache": cache_stats,
            }
            print(f"{name}: {wall:.1f} s for {len(record)} turns")
            if cache_stats:
                print(f"  /health prompt_cache: {cache_stats}")

    # Cold prefill of the single-agent conversation's prompts at the chosen turns.
    cold_ttft: dict[int, tuple[int, float]] = {}
    if single_convs:
        conv = single_convs[0]
        for turn in args.cold_turns:
            if turn not in conv.sent:
                continue
            prompt = cold.render(conv.sent[turn])
            cold_ttft[turn] = (len(prompt), cold.ttft(prompt))
            print(f"cold turn {turn}: {len(prompt)} tokens, {cold_ttft[turn][1]:.2f} s")
    results["cold"] = {str(k): {"tokens": v[0], "ttft_s": v[1]} for k, v in cold_ttft.items()}
    results["runs"] = runs
    results["openblas"] = blas
    print(f"OpenBLAS mapped: {blas}")
    report(runs, cold_ttft, args)
    if "base" in kinds:
        results["ab"] = ab_report(runs, args)
    results["load_average"] = os.getloadavg()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"agent-loop-{stamp}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


def report(
    runs: dict[str, dict[str, Any]], cold: dict[int, tuple[int, float]], args: argparse.Namespace
) -> None:
    def turns_of(name: str) -> list[Turn]:
        return [Turn(**t) for t in runs.get(name, {}).get("turns", [])]

    for agents in args.agent_counts:
        ours, peer = turns_of(f"ours-{agents}"), turns_of(f"peer-{agents}")
        print(f"\n{agents} agent(s): median over agents per turn")
        print(
            "| turn | prompt tokens | ours TTFT s | peer TTFT s | cold TTFT s | ours/cold "
            "| ours/peer | cached ours / peer |"
        )
        print("|---|---|---|---|---|---|---|---|")
        o, p = by_turn(ours), by_turn(peer)
        for turn in range(1, args.turns + 1):
            ot, pt = o.get(turn, []), p.get(turn, [])
            o_ttft = median([t.ttft_s for t in ot])
            p_ttft = median([t.ttft_s for t in pt])
            c = cold.get(turn)
            c_ttft = c[1] if c else float("nan")
            prompt = int(median([t.prompt_tokens for t in ot])) if ot else 0
            cached_o = int(median([t.cached_tokens for t in ot])) if ot else 0
            cached_p = int(median([t.cached_tokens for t in pt])) if pt else 0
            print(
                f"| {turn} | {prompt} | {o_ttft:.2f} | {p_ttft:.2f} | {c_ttft:.2f} "
                f"| {o_ttft / c_ttft:.2f} | {o_ttft / p_ttft:.2f} | {cached_o} / {cached_p} |"
            )
        for name, turns in (("ours", ours), ("peer", peer)):
            if turns:
                share = reuse_share(turns, replayed_prefix(turns, args.output_tokens))
                print(
                    f"{name} x{agents}: wall {runs[f'{name}-{agents}']['wall_s']:.1f} s, "
                    f"cached / replayed prefix (turns 2+) {share:.1%}"
                )


def ab_report(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Ours against ``base`` run by run: wall time and median TTFT of turns 2 on (the turns the
    prompt cache serves); the ratios are ours over base, of the medians over repeats."""
    out: dict[str, Any] = {}
    print(f"\nside by side, ours against base (load average now {os.getloadavg()[0]:.1f})")
    print("| agents | kind | wall s per run | TTFT s turns 2+ (median) per run |")
    print("|---|---|---|---|")
    for agents in args.agent_counts:
        figures: dict[str, tuple[list[float], list[float]]] = {}
        for kind in ("ours", "base"):
            names = sorted(
                (n for n in runs if n == f"{kind}-{agents}" or n.startswith(f"{kind}-{agents}-r")),
                key=lambda n: (len(n), n),
            )
            walls = [runs[n]["wall_s"] for n in names]
            ttfts = [
                median([t["ttft_s"] for t in runs[n]["turns"] if t["turn"] > 1]) for n in names
            ]
            figures[kind] = (walls, ttfts)
            print(
                f"| {agents} | {kind} | {', '.join(f'{w:.1f}' for w in walls)} "
                f"| {', '.join(f'{t:.2f}' for t in ttfts)} |"
            )
        (ow, ot), (bw, bt) = figures["ours"], figures["base"]
        if ow and bw:
            wall_ratio = median(ow) / median(bw)
            ttft_ratio = median(ot) / median(bt)
            print(
                f"{agents} agent(s): ours/base wall {wall_ratio:.2f}, TTFT turns 2+ {ttft_ratio:.2f}"
            )
            out[str(agents)] = {"wall": wall_ratio, "ttft_after_first": ttft_ratio}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
