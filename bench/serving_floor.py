"""How close can any HTTP server come to mlx-lm driven directly, on this machine, at a few streams?

Run::

    .venv/bin/python bench/serving_floor.py [--model PATH] [--concurrency 1] [--turns 4]
        [--max-tokens 512] [--rounds 10] [--linger 0.025[,0.1...]] [--base-command CMD]
        [--busy-us US --busy-where thread,passes,process --busy-passes 5]
        [--floor-switch-interval S] [--server-arg ARG ...] [--prompt-cache]

Three sides, interleaved round by round (the order rotates), each running the same workload as
``bench/throughput.py`` (C streams of ``--turns`` requests one after another, greedy, the same
prompts):

- **direct**: ``throughput.DirectRunner``, mlx-lm's ``BatchGenerator`` in this process, a
  stream's next prompt inserted into the batch the step its last one ends (no client, no HTTP);
- **floor**: the least a streaming server can do (``--serve-floor``, this file): the same
  ``BatchGenerator`` on a thread of its own, one thread per connection reading HTTP/1.1 from a
  plain socket, rendering the prompt, and writing the tokens' text as SSE text deltas at most
  every ``--linger`` seconds (the server's lone-stream pacing), then a terminal event with the
  usage. No framework, no event loop, no events but those two, no store;
- **ours**: ``mlx-responses serve`` (``throughput.running_server``), its prompt cache off
  unless ``--prompt-cache`` (every turn sends the same prompt, which the other sides prefill);
  ``--base-command`` adds a second one started with another command line (an older commit's
  ``src/`` on ``PYTHONPATH``), ``--server-arg`` adds arguments to both.

``--busy-us`` adds floors doing that much Python per delta (``Busy``): the server's own work
per delta, placed on the delta's thread, split into scheduler-like passes, or in a process.

Both servers are read by the same client (``throughput.server_run``: Trio and httpx, an SSE
parser). Each round's tokens/s goes over direct's of the same round; medians are printed with
each side's CPU per 1,000 tokens (the client's too). The floor is not a server anyone should
run: it is the bound for what serving over HTTP to a client on the same machine costs, which
the ratio of ours to direct cannot beat.
Samples go to ``bench/results/serving-floor-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput

# The server's delta pacing for one decoding stream (``actors/pacing.py``).
DEFAULT_LINGER_SECONDS = 0.025


# -- the floor server (a subprocess: ``--serve-floor PORT``) -------------------------------------


class Outbox:
    """One request's tokens, pushed by the engine thread, taken by its connection's thread. The
    engine wakes the taker only when it waits for any token or for the end (as the server's slot
    does: a lingering reader is not woken per token)."""

    def __init__(self) -> None:
        self.ready = threading.Condition()
        self.tokens: list[int] = []
        self.done = False
        self.waiting = False

    def push(self, token: int | None, done: bool) -> None:
        with self.ready:
            if token is not None:
                self.tokens.append(token)
            self.done = self.done or done
            if self.waiting or done:
                self.ready.notify()

    def take(self, linger_until: float) -> tuple[list[int], bool]:
        """Wait for a token, then until ``linger_until`` (``perf_counter``) or the end."""
        with self.ready:
            self.waiting = True
            while not self.tokens and not self.done:
                self.ready.wait()
            self.waiting = False
            while not self.done and (left := linger_until - time.perf_counter()) > 0:
                self.ready.wait(left)
            tokens, self.tokens = self.tokens, []
            return tokens, self.done


def engine_thread(model: Any, inbox: queue.SimpleQueue[Any]) -> None:
    """``BatchGenerator`` as ``DirectRunner`` configures it; new prompts join between steps.
    A failure ends the process (the bench then reads a closed connection, not a hang)."""
    try:
        generate(model, inbox)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def generate(model: Any, inbox: queue.SimpleQueue[Any]) -> None:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    generator = BatchGenerator(
        model,
        completion_batch_size=throughput.COMPLETION_BATCH_SIZE,
        prefill_batch_size=throughput.PREFILL_BATCH_SIZE,
        prefill_step_size=throughput.PREFILL_STEP_SIZE,
        stream=mx.new_stream(mx.default_device()),  # MLX streams belong to their thread
    )
    sampler = make_sampler(temp=0.0)
    live: dict[int, Outbox] = {}
    while True:
        arrivals = [inbox.get()] if not live else []
        while True:
            try:
                arrivals.append(inbox.get_nowait())
            except queue.Empty:
                break
        for prompt, max_tokens, stop_sequences, outbox in arrivals:
            (uid,) = generator.insert(
                [prompt],
                max_tokens=[max_tokens],
                samplers=[sampler],
                stop_sequences=[stop_sequences],
            )
            live[uid] = outbox
        _, responses = generator.next()
        for response in responses:
            outbox = live[response.uid]
            done = response.finish_reason is not None
            token = None if response.finish_reason == "stop" else int(response.token)
            outbox.push(token, done)
            if done:
                del live[response.uid]


def sse(event: str, data: dict[str, Any]) -> bytes:
    body = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(body), body)


def serve_connection(
    connection: socket.socket,
    tokenizer: Any,
    stop_sequences: Any,
    inbox: queue.SimpleQueue[Any],
    linger: float,
    busy: Busy,
) -> None:
    reader = connection.makefile("rb")
    with connection, reader:
        while True:
            request_line = reader.readline()
            if not request_line:
                return
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            body = reader.read(length) if length else b""
            if not request_line.startswith(b"POST"):
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                continue
            request = json.loads(body)
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": request["input"]}],
                add_generation_prompt=True,
                tokenize=True,
            )
            outbox = Outbox()
            inbox.put(
                ([int(t) for t in prompt], request["max_output_tokens"], stop_sequences, outbox)
            )
            connection.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            detokenizer = tokenizer.detokenizer
            count = 0
            flushed = 0.0
            done = False
            while not done:
                tokens, done = outbox.take(flushed + linger)
                for token in tokens:
                    detokenizer.add_token(token)
                if done:
                    detokenizer.finalize()
                count += len(tokens)
                text = detokenizer.last_segment
                chunk = sse("response.output_text.delta", {"delta": text}) if text else b""
                if done:
                    usage = {"usage": {"output_tokens": count}}
                    chunk += sse("response.completed", {"response": usage}) + b"0\r\n\r\n"
                busy.work()
                connection.sendall(chunk)
                flushed = time.perf_counter()


# What ``--busy-where process`` runs: for each byte read from its stdin, Python busy for the
# given microseconds (its own interpreter and GIL, on the same cores).
BUSY_PROCESS = """
import os, sys, time
seconds = float(sys.argv[1]) / 1e6
while os.read(0, 1):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
"""


class Busy:
    """Python work per delta beside the engine, as a server's own work per delta (the event
    loop's is ~0.5 ms): none; on the delta's thread, holding this process's GIL (``thread``);
    the same in ``passes`` slices, each after giving the GIL up and taking it back, as an
    event loop's scheduler passes do (its ``epoll_wait`` between them); or in a process of its
    own woken per delta (as an event loop would be if the engine had a process of its own)."""

    def __init__(self, microseconds: float, where: str, passes: int = 1) -> None:
        self.seconds = microseconds / 1e6
        self.passes = max(1, passes) if where == "passes" else 1
        self.process: subprocess.Popen[bytes] | None = None
        if self.seconds > 0 and where == "process":
            self.process = subprocess.Popen(
                [sys.executable, "-c", BUSY_PROCESS, str(microseconds)], stdin=subprocess.PIPE
            )

    def work(self) -> None:
        if self.seconds <= 0:
            return
        if self.process is not None:
            assert self.process.stdin is not None
            os.write(self.process.stdin.fileno(), b"x")
            return
        for _ in range(self.passes):
            if self.passes > 1:
                time.sleep(0)  # the GIL given up and taken back
            end = time.perf_counter() + self.seconds / self.passes
            while time.perf_counter() < end:
                pass


def serve_floor(
    port: int, model_path: str, linger: float, busy: Busy, switch_interval: float | None
) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    throughput.preload_openblas()  # before mlx loads
    from mlx_lm import load
    from mlx_lm.generate import make_stop_sequences

    model, tokenizer = load(model_path)[:2]
    stop_sequences = make_stop_sequences(tokenizer)
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=engine_thread, args=(model, inbox), daemon=True).start()
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        connection, _ = listener.accept()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(
            target=serve_connection,
            args=(connection, tokenizer, stop_sequences, inbox, linger, busy),
            daemon=True,
        ).start()


# -- the comparison --------------------------------------------------------------------------------


def start_floor(
    model_path: str, linger: float, log_path: Path, options: Sequence[str] = ()
) -> throughput.ServerProcess:
    port = throughput.free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [
                *(sys.executable, __file__, "--serve-floor", str(port)),
                *("--model", model_path, "--linger", str(linger), *options),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = throughput.ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
    throughput.wait_ready(server, 120.0)
    return server


def measure_server(
    server: throughput.ServerProcess, concurrency: int, max_tokens: int, turns: int
) -> dict[str, float]:
    pid = server.process.pid
    cpu, mine = throughput.process_cpu(pid), time.process_time()
    m = trio.run(throughput.server_run, server.base_url, concurrency, max_tokens, turns)
    return {
        "tokens": m.tokens,
        "tps": m.tokens_per_second,
        "cpu_per_1k": (throughput.process_cpu(pid) - cpu) / m.tokens * 1000,
        "client_cpu_per_1k": (time.process_time() - mine) / m.tokens * 1000,
    }


def seconds_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--linger",
        type=seconds_list,
        default=[DEFAULT_LINGER_SECONDS],
        help="the floor's delta interval in seconds; a comma list runs one floor server each",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="an argument added to ours' `serve` command line (repeatable)",
    )
    parser.add_argument(
        "--busy-us",
        type=float,
        default=0.0,
        help="also run floors (at the first --linger) that do this much Python work per delta",
    )
    parser.add_argument(
        "--busy-where",
        default="thread,process",
        help="where the busy floors work: 'thread' (the delta's thread, this process's GIL), "
        "'passes' (the same in --busy-passes slices, the GIL given up before each), "
        "'process' (a process of their own, woken per delta), or both",
    )
    parser.add_argument(
        "--busy-passes",
        type=int,
        default=5,
        help="slices of a 'passes' floor's work per delta (the server's loop makes ~5 "
        "scheduler passes a delta)",
    )
    parser.add_argument(
        "--floor-switch-interval",
        type=float,
        default=None,
        help="the floors' GIL switch interval in seconds (default Python's 0.005; the server "
        "sets 0.0005)",
    )
    parser.add_argument(
        "--base-command",
        default=None,
        help="a second server to compare ('base'), started with this command line instead "
        'of mlx-responses (e.g. "env PYTHONPATH=/tmp/old .venv/bin/mlx-responses")',
    )
    parser.add_argument(
        "--prompt-cache",
        action="store_true",
        help="leave the servers' prompt cache on (off by default, as in throughput.py: every "
        "turn sends the same prompt, which direct and the floor prefill each time)",
    )
    parser.add_argument("--serve-floor", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model_path = throughput.resolve_model(args.model)
    server_args = [*args.server_arg, *(() if args.prompt_cache else ("--prompt-cache-bytes", "0"))]
    if args.serve_floor is not None:
        busy = Busy(args.busy_us, args.busy_where, args.busy_passes)
        serve_floor(args.serve_floor, model_path, args.linger[0], busy, args.floor_switch_interval)
        return 0
    throughput.use_documented_prompt(model_path)
    blas = throughput.preload_openblas()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = throughput.RESULTS_DIR / f"serving-floor-{stamp}"
    direct = throughput.DirectRunner(model_path)
    direct.run(args.concurrency, args.max_tokens, 1)  # warm: kernels, caches
    servers: dict[str, throughput.ServerProcess] = {}
    rows: list[dict[str, Any]] = []
    try:
        switch = (
            ("--floor-switch-interval", str(args.floor_switch_interval))
            if args.floor_switch_interval is not None
            else ()
        )
        for linger in args.linger:
            name = f"floor {linger * 1000:g} ms"
            log = logs / f"floor-{linger}.log"
            servers[name] = start_floor(model_path, linger, log, switch)
        for where in args.busy_where.split(",") if args.busy_us > 0 else ():
            shape = f"{where} x{args.busy_passes}" if where == "passes" else where
            name = f"floor busy {args.busy_us:g} us ({shape})"
            options = (*switch, "--busy-us", str(args.busy_us), "--busy-where", where)
            options += ("--busy-passes", str(args.busy_passes))
            log = logs / f"floor-busy-{where}.log"
            servers[name] = start_floor(model_path, args.linger[0], log, options)
        with contextlib.ExitStack() as stack:
            ours = stack.enter_context(
                throughput.running_server(
                    throughput.default_server_command(),
                    model_path,
                    logs / "ours.log",
                    extra_args=server_args,
                )
            )
            servers["ours"] = ours
            if args.base_command:
                servers["base"] = stack.enter_context(
                    throughput.running_server(
                        shlex.split(args.base_command),
                        model_path,
                        logs / "base.log",
                        extra_args=server_args,
                    )
                )
            for side in servers.values():  # warm
                trio.run(throughput.server_run, side.base_url, args.concurrency, 32, 1)
            sides = ["direct", *servers]
            for round_index in range(args.rounds):
                shift = round_index % len(sides)
                row: dict[str, Any] = {}
                for side in sides[shift:] + sides[:shift]:
                    time.sleep(throughput.SETTLE_SECONDS / 2)
                    if side == "direct":
                        cpu = time.process_time()
                        m = direct.run(args.concurrency, args.max_tokens, args.turns)
                        row[side] = {
                            "tokens": m.tokens,
                            "tps": m.tokens_per_second,
                            "cpu_per_1k": (time.process_time() - cpu) / m.tokens * 1000,
                        }
                    else:
                        row[side] = measure_server(
                            servers[side], args.concurrency, args.max_tokens, args.turns
                        )
                rows.append(row)
                ratios = ", ".join(
                    f"{side} {row[side]['tps'] / row['direct']['tps']:.3f}" for side in servers
                )
                print(
                    f"round {round_index + 1}: direct {row['direct']['tps']:.0f} tok/s; {ratios}",
                    flush=True,
                )
    finally:
        for name, server in servers.items():
            if name.startswith("floor"):
                throughput.stop_server(server)
        direct.close()

    def median(side: str, key: str) -> float:
        return statistics.median(row[side][key] for row in rows)

    def ratio(side: str, over: str) -> float:
        return statistics.median(row[side]["tps"] / row[over]["tps"] for row in rows)

    print(
        f"\n{args.concurrency} stream(s), {args.turns} turns, --max-tokens {args.max_tokens}, "
        f"{args.rounds} rounds, OpenBLAS {'loaded' if blas else 'not loaded'}"
        + (f", ours with {' '.join(args.server_arg)}" if args.server_arg else "")
    )
    for side in servers:
        print(f"{side} / direct: {ratio(side, 'direct'):.3f}")
    for side in servers:
        if side != "ours":
            print(f"ours / {side}: {ratio('ours', side):.3f}")
    print(f"CPU per 1,000 tokens, direct: {median('direct', 'cpu_per_1k'):.2f} s")
    for side in servers:
        print(
            f"CPU per 1,000 tokens, {side}: {median(side, 'cpu_per_1k'):.2f} s, "
            f"its client {median(side, 'client_cpu_per_1k'):.3f} s"
        )
    out = throughput.RESULTS_DIR / f"serving-floor-{stamp}.json"
    out.write_text(json.dumps({"args": vars(args), "openblas": blas, "rounds": rows}, indent=1))
    print(f"samples: {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
