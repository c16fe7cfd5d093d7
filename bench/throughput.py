"""Throughput of the server against mlx-lm's BatchGenerator driven directly, and cancel latency.

Run::

    .venv/bin/python bench/throughput.py [--model PATH] [--concurrency 1,4,16]
        [--max-tokens 128] [--repeats 3] [--disconnects 30] [--background 3]

1. Direct baseline: in this process, on its main thread (the only thread that touches MLX here),
   ``BatchGenerator`` with the server's batch settings runs C greedy prompts, templated as the
   server templates them, inserted together; tokens/s = generated tokens (stop token excluded)
   over the time from ``insert`` to the last token.
2. Server: ``mlx-responses serve`` as a subprocess on the same model; C concurrent streaming
   clients (Trio + httpx2), each with a distinct prompt (on the bundled model: its documented
   long prompt, see ``use_documented_prompt``), temperature 0 and the same
   ``max_output_tokens``; tokens/s = the sum of ``usage.output_tokens`` over the time from the
   first request sent to the last terminal event.
   Direct and server measurements alternate (the order flips every repeat); medians are reported.
3. Disconnect latency: a long stream is read until a few text deltas arrive (t0), then the
   connection is closed and ``/health`` is polled until ``batch.sequences_cancelled`` moves
   (t1). Once idle, once with background streams generating.

Every figure that matters is a ratio measured in the same run, because the machine is shared.
Results are printed and written to ``bench/results/throughput-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from first_token import first_token_lines, first_token_stats, headline
from make_bench_model import MODELS_DIR, make_bench_model
from profiling import find_py_spy, profile_runs

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
# Issue 12: ours / direct at 16 streams, >= 0.9 on the bundled tiny model (where the engine
# costs least per token, so the server's own work shows) and >= 0.95 on the bench model.
TARGET_RATIO_TINY = 0.9
TARGET_RATIO_BENCH = 0.95
TARGET_CONCURRENCY = 16
# The server's defaults (``mlx-responses serve --help``), used for the direct baseline too.
COMPLETION_BATCH_SIZE = 32
PREFILL_BATCH_SIZE = 8
PREFILL_STEP_SIZE = 512
DELTAS_BEFORE_DISCONNECT = 3
# The pause before each measured run (see the loop in ``main``).
SETTLE_SECONDS = 1.0
LONG_MAX_TOKENS = 3000


# A model folder with documented prompts (the bundled model's ``prompts.json``) is asked its
# long one by every stream: its answers to any other prompt are whatever the weights give, a
# few tokens or many, and change with every rebuild, which would make the workload (tokens per
# stream) change with them. Other models (random weights) get a distinct prompt per stream and
# generate up to ``max_tokens``.
LONG_PROMPT_NAME = "count"
_documented_prompt: str | None = None


def use_documented_prompt(model_path: str) -> str | None:
    """Pick the documented long prompt of ``model_path``, if it has one; the prompt's text."""
    global _documented_prompt
    path = Path(model_path) / "prompts.json"
    if not path.is_file():
        return None
    records = json.loads(path.read_text(encoding="utf-8"))
    for record in records:
        if record.get("name") == LONG_PROMPT_NAME:
            _documented_prompt = str(record["messages"][-1]["content"])
    return _documented_prompt


def prompt_text(index: int) -> str:
    if _documented_prompt is not None:
        return _documented_prompt
    return f"Request {index}: tell me a long story about the number {index} and a lighthouse."


# -- direct baseline -----------------------------------------------------------------------------


@dataclass(slots=True)
class Measurement:
    concurrency: int
    tokens: int
    seconds: float
    outputs: tuple[str, ...] = ()
    # Time from the start to each stream's first token: earliest and latest.
    first_token_s: tuple[float, float] = (0.0, 0.0)
    # CPU seconds used while measuring: by the process that generates (this one for direct,
    # the server for server runs), and by this process's HTTP clients (server runs only).
    cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    # Server runs: the CPU seconds of the server's main thread alone (the Trio loop: HTTP,
    # events, JSON), the part of the server's work that is not the model's.
    trio_cpu_s: float = 0.0
    # Where the measured window began (``time.perf_counter``): it ends ``seconds`` later.
    started_at: float = 0.0
    # Every request's own time to its first token (every turn of every stream): from its
    # insertion (direct) or its send (server).
    request_first_s: tuple[float, ...] = ()

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class DirectRunner:
    """mlx-lm's BatchGenerator on the bench process's main thread, configured as the server."""

    def __init__(self, model_path: str) -> None:
        import mlx.core as mx
        from mlx_lm import load
        from mlx_lm.generate import make_stop_sequences

        self._mx = mx
        self.model, self.tokenizer = load(model_path)[:2]
        self.stop_sequences = make_stop_sequences(self.tokenizer)
        self.stream = mx.new_stream(mx.default_device())

    def render(self, text: str) -> list[int]:
        tokens = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return [int(t) for t in tokens]

    def run(
        self, concurrency: int, max_tokens: int, turns: int = 1, texts: Sequence[str] = ()
    ) -> Measurement:
        """``concurrency`` streams, each ``turns`` requests one after another: a stream's next
        prompt is inserted when its last one finishes, into the running batch. Stream ``i``
        asks ``texts[i]`` (default: ``prompt_text(i)``)."""
        from mlx_lm.generate import BatchGenerator
        from mlx_lm.sample_utils import make_sampler

        asked = list(texts) or [prompt_text(i) for i in range(concurrency)]
        prompts = [self.render(text) for text in asked]
        generator = BatchGenerator(
            self.model,
            completion_batch_size=COMPLETION_BATCH_SIZE,
            prefill_batch_size=PREFILL_BATCH_SIZE,
            prefill_step_size=PREFILL_STEP_SIZE,
            stream=self.stream,
        )
        sampler = make_sampler(temp=0.0)
        generated: dict[int, list[int]] = {}
        stream_of: dict[int, int] = {}
        try:
            start = time.perf_counter()
            uids = generator.insert(
                prompts,
                max_tokens=[max_tokens] * concurrency,
                samplers=[sampler] * concurrency,
                stop_sequences=[self.stop_sequences] * concurrency,
            )
            stream_of = {uid: index for index, uid in enumerate(uids)}
            generated = {uid: [] for uid in uids}
            left = [turns - 1] * concurrency
            first: dict[int, float] = {}
            inserted = dict.fromkeys(uids, start)
            request_first: dict[int, float] = {}
            running = set(uids)
            end = start
            while running:
                _, responses = generator.next()
                now = time.perf_counter()
                for response in responses:
                    stream = stream_of[response.uid]
                    first.setdefault(stream, now - start)
                    request_first.setdefault(response.uid, now - inserted[response.uid])
                    if response.finish_reason != "stop":
                        generated[response.uid].append(int(response.token))
                    if response.finish_reason is not None:
                        running.discard(response.uid)
                        if left[stream] > 0:
                            left[stream] -= 1
                            at = time.perf_counter()
                            (uid,) = generator.insert(
                                [prompts[stream]],
                                max_tokens=[max_tokens],
                                samplers=[sampler],
                                stop_sequences=[self.stop_sequences],
                            )
                            stream_of[uid] = stream
                            inserted[uid] = at
                            generated[uid] = []
                            running.add(uid)
                if responses:
                    end = now
        finally:
            generator.close()
        texts = tuple(
            "".join(self.detokenize(generated[uid]) for uid in generated if stream_of[uid] == i)
            for i in range(concurrency)
        )
        tokens = sum(len(v) for v in generated.values())
        spread = (min(first.values()), max(first.values()))
        return Measurement(
            concurrency,
            tokens,
            end - start,
            texts,
            spread,
            started_at=start,
            request_first_s=tuple(request_first.values()),
        )

    def detokenize(self, tokens: list[int]) -> str:
        """Text as the server streams it (mlx-lm's streaming detokenizer, which differs from
        ``tokenizer.decode`` on some byte-level tokens)."""
        detokenizer = self.tokenizer.detokenizer
        parts = []
        for token in tokens:
            detokenizer.add_token(token)
            parts.append(detokenizer.last_segment)
        detokenizer.finalize()
        parts.append(detokenizer.last_segment)
        return "".join(parts)

    def close(self) -> None:
        self._mx.synchronize()


# -- the server ----------------------------------------------------------------------------------


def process_cpu(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of a process, all threads, or of its ``thread`` (a Linux
    thread id; the main thread's is the pid) (Linux ``/proc``; NaN elsewhere)."""
    stat = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_server_command() -> list[str]:
    script = Path(sys.executable).with_name("mlx-responses")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "mlx_responses.cli"]


@dataclass(slots=True)
class ServerProcess:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    exit_code: int | None = None
    killed: bool = False

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def running_server(
    command: Sequence[str],
    model_path: str,
    log_path: Path,
    *,
    ready_timeout: float = 120.0,
    extra_args: Sequence[str] = (),
) -> Iterator[ServerProcess]:
    """Start the server, wait for ``/health``; always SIGTERM it (then kill) on the way out."""
    port = free_port()
    argv = [
        *command,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model_path,
        "--alias",
        "bench",
        "--log-level",
        "info",
        *extra_args,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C here reaches the bench only; we stop the server
            # Generation is measured here, not storage (bench/store.py): keep the in-memory
            # store unless the caller's environment names another.
            env={
                **os.environ,
                "MLX_RESPONSES_STORE": os.environ.get("MLX_RESPONSES_STORE", "memory"),
            },
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_ready(server, ready_timeout)
        yield server
    finally:
        stop_server(server)


def wait_ready(server: ServerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                tail = server.log_tail()
                hint = (
                    "\n(the editable install predates a module added to src/: "
                    "`make install` or run `make bench`)"
                    if "No module named 'mlx_responses" in tail
                    else ""
                )
                raise RuntimeError(
                    f"the server exited with {server.process.returncode} before it was ready:\n"
                    + tail
                    + hint
                )
            try:
                if client.get(server.base_url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s:\n{server.log_tail()}")


def stop_server(server: ServerProcess, grace: float = 30.0) -> None:
    process = server.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            server.killed = True
            process.kill()
            process.wait()
    server.exit_code = process.returncode
    if server.exit_code != 0:
        print(
            f"WARNING: the server exited with {server.exit_code} after SIGTERM"
            + (" (killed after the grace period)" if server.killed else "")
            + f"; log tail:\n{server.log_tail()}",
            file=sys.stderr,
        )


class SseReader:
    """Incremental SSE parser over an httpx streaming response."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()
        self._event = ""
        self._data: list[str] = []

    async def next_event(self) -> tuple[str, dict[str, Any]] | None:
        async for line in self._lines:
            if line.startswith("event:"):
                self._event = line[6:].strip()
            elif line.startswith("data:"):
                self._data.append(line[5:].lstrip())
            elif not line and self._data:
                event, data = self._event, json.loads("\n".join(self._data))
                self._event, self._data = "", []
                return event, data
        return None


TERMINAL_EVENTS = {"response.completed", "response.incomplete", "response.failed"}


@dataclass(slots=True)
class StreamResult:
    text: str = ""
    output_tokens: int = 0
    terminal: str = ""
    deltas: int = 0
    sent_at: float = 0.0  # when the request was handed to the client
    first_delta_at: float = 0.0
    done_at: float = 0.0


def request_body(index: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "input": prompt_text(index),
        "temperature": 0,
        "max_output_tokens": max_tokens,
        "stream": True,
    }


async def whole_one(client: httpx.AsyncClient, base_url: str, body: dict[str, Any]) -> StreamResult:
    """One request answered whole (``stream`` false): the same work without a delta stream.
    Its first delta is its whole answer."""
    result = StreamResult(sent_at=time.perf_counter())
    response = await client.post(base_url + "/v1/responses", json={**body, "stream": False})
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.text}")
    data = response.json()
    result.done_at = result.first_delta_at = time.perf_counter()
    result.terminal = f"response.{data['status']}"
    result.output_tokens = int((data.get("usage") or {}).get("output_tokens", 0))
    result.deltas = 1
    result.text = "".join(
        part.get("text", "")
        for item in data.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
    )
    return result


async def stream_one(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any]
) -> StreamResult:
    result = StreamResult(sent_at=time.perf_counter())
    parts: list[str] = []
    async with client.stream("POST", base_url + "/v1/responses", json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"HTTP {response.status_code}: {detail}")
        reader = SseReader(response)
        while (item := await reader.next_event()) is not None:
            event, data = item
            if event == "response.output_text.delta":
                if not result.deltas:
                    result.first_delta_at = time.perf_counter()
                result.deltas += 1
                parts.append(data["delta"])
            elif event in TERMINAL_EVENTS:
                result.terminal = event
                result.done_at = time.perf_counter()
                usage = data["response"].get("usage") or {}
                result.output_tokens = int(usage.get("output_tokens", 0))
            elif event == "error":
                raise RuntimeError(f"error event: {data}")
    if not result.terminal:
        raise RuntimeError("the stream ended without a terminal event")
    result.text = "".join(parts)
    return result


def new_client(connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(300.0, connect=10.0),
        limits=httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections),
    )


async def server_run(
    base_url: str, concurrency: int, max_tokens: int, turns: int = 1, whole: bool = False
) -> Measurement:
    """``concurrency`` streams, each ``turns`` requests one after another (a stream's next
    request is sent when its last one's terminal event is read); ``whole``: each answered as
    one JSON body, not streamed (its first token's time is then its last's)."""
    ask = whole_one if whole else stream_one
    results: list[list[StreamResult]] = [[] for _ in range(concurrency)]
    async with new_client(concurrency) as client:
        # Open the connections first so the timed window measures requests, not TCP set-up.
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(client.get, base_url + "/health")

        async def one(index: int) -> None:
            body = request_body(index, max_tokens)
            for _ in range(turns):
                results[index].append(await ask(client, base_url, body))

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(concurrency):
                nursery.start_soon(one, index)
    done = [r for stream in results for r in stream]
    firsts = [stream[0].first_delta_at for stream in results]
    end = max(r.done_at for r in done)
    return Measurement(
        concurrency,
        sum(r.output_tokens for r in done),
        end - start,
        tuple("".join(r.text for r in stream) for stream in results),
        (min(firsts) - start, max(firsts) - start),
        started_at=start,
        request_first_s=tuple(r.first_delta_at - r.sent_at for r in done),
    )


# -- disconnect latency ---------------------------------------------------------------------------


async def cancelled_count(client: httpx.AsyncClient, base_url: str) -> int:
    response = await client.get(base_url + "/health")
    return int(response.json()["batch"]["sequences_cancelled"])


async def one_disconnect(
    client: httpx.AsyncClient, poller: httpx.AsyncClient, base_url: str, index: int
) -> float:
    before = await cancelled_count(poller, base_url)
    body = request_body(index, LONG_MAX_TOKENS)
    async with client.stream("POST", base_url + "/v1/responses", json=body) as response:
        reader = SseReader(response)
        deltas = 0
        while deltas < DELTAS_BEFORE_DISCONNECT:
            item = await reader.next_event()
            if item is None:
                raise RuntimeError("the long stream ended before the disconnect")
            if item[0] == "response.output_text.delta":
                deltas += 1
        t0 = time.perf_counter()
    # Leaving the block closes the unfinished response, which closes its connection.
    while await cancelled_count(poller, base_url) <= before:
        pass
    return time.perf_counter() - t0


async def background_stream(client: httpx.AsyncClient, base_url: str, index: int) -> None:
    """Keep one long stream generating until cancelled (restart it if it ever finishes)."""
    while True:
        await stream_one(client, base_url, request_body(index, LONG_MAX_TOKENS))


async def wait_decoding(poller: httpx.AsyncClient, base_url: str, count: int) -> None:
    while True:
        batch = (await poller.get(base_url + "/health")).json()["batch"]
        if batch["decoding"] >= count:
            return
        await trio.sleep(0.02)


async def decode_step_seconds(poller: httpx.AsyncClient, base_url: str, window: float) -> float:
    """Mean time of one batch step while the batch only decodes (from ``/health`` counters)."""
    first = (await poller.get(base_url + "/health")).json()["batch"]
    start = time.perf_counter()
    await trio.sleep(window)
    last = (await poller.get(base_url + "/health")).json()["batch"]
    elapsed = time.perf_counter() - start
    steps = (last["tokens_generated"] - first["tokens_generated"]) / max(1, last["decoding"])
    return elapsed / steps if steps > 0 else math.nan


async def disconnect_latencies(
    base_url: str, runs: int, background: int
) -> tuple[list[float], float | None]:
    """Latencies of ``runs`` disconnects, and the decode step time with the background load."""
    latencies: list[float] = []
    step: float | None = None
    async with new_client(4) as client, new_client(2) as poller, new_client(background) as bg:
        async with trio.open_nursery() as nursery:
            for b in range(background):
                nursery.start_soon(background_stream, bg, base_url, 1000 + b)
            if background:
                await wait_decoding(poller, base_url, background)
                step = await decode_step_seconds(poller, base_url, 2.0)
            for run in range(runs):
                latencies.append(await one_disconnect(client, poller, base_url, 500 + run))
            nursery.cancel_scope.cancel()
    # The background streams' own cancellations land after this point; let them settle.
    async with new_client(1) as poller:
        deadline = trio.current_time() + 10
        while trio.current_time() < deadline:
            batch = (await poller.get(base_url + "/health")).json()["batch"]
            if batch["active"] == 0:
                break
            await trio.sleep(0.05)
    return latencies, step


# -- reporting -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (with 30 samples p99 is the largest)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(slots=True)
class Row:
    concurrency: int
    direct_runs: list[Measurement] = field(default_factory=list)
    server_runs: list[Measurement] = field(default_factory=list)
    identical_outputs: list[int] = field(default_factory=list)
    # ``--whole``: the server's runs with every answer whole (no delta stream).
    whole_runs: list[Measurement] = field(default_factory=list)

    @property
    def direct(self) -> list[float]:
        return [m.tokens_per_second for m in self.direct_runs]

    @property
    def server(self) -> list[float]:
        return [m.tokens_per_second for m in self.server_runs]

    @property
    def direct_median(self) -> float:
        return statistics.median(self.direct)

    @property
    def server_median(self) -> float:
        return statistics.median(self.server)

    @property
    def paired_ratios(self) -> list[float]:
        """server/direct of each repeat: the two ran back to back, under the same conditions."""
        return [s / d for s, d in zip(self.server, self.direct, strict=True) if d]

    @property
    def ratio(self) -> float:
        """The median of the paired ratios (less exposed to drifting load than a ratio of
        medians)."""
        return statistics.median(self.paired_ratios) if self.paired_ratios else math.nan

    @property
    def whole_ratios(self) -> list[float]:
        """whole-answer server/direct of each repeat (``--whole``; empty without it)."""
        direct = self.direct[: len(self.whole_runs)]
        return [w.tokens_per_second / d for w, d in zip(self.whole_runs, direct, strict=True) if d]

    def cpu_per_kilotoken(self, runs: list[Measurement], attr: str) -> float:
        return statistics.median(1000 * getattr(m, attr) / max(1, m.tokens) for m in runs)

    @property
    def cpu_ratio(self) -> float:
        """Direct CPU per token over server CPU per token: the share of the server's CPU that
        goes to generation, whatever else runs on the machine."""
        server = self.cpu_per_kilotoken(self.server_runs, "cpu_s")
        return self.cpu_per_kilotoken(self.direct_runs, "cpu_s") / server if server else math.nan

    def as_json(self) -> dict[str, Any]:
        per_kilotoken = self.cpu_per_kilotoken
        return {
            "concurrency": self.concurrency,
            "direct_tok_s": self.direct_median,
            "server_tok_s": self.server_median,
            "ratio": self.ratio,
            "ratio_of_medians": self.server_median / self.direct_median,
            "cpu_ratio": self.cpu_ratio,
            "paired_ratios": [round(r, 3) for r in self.paired_ratios],
            "direct_samples": [round(x, 2) for x in self.direct],
            "server_samples": [round(x, 2) for x in self.server],
            "direct_tokens": [m.tokens for m in self.direct_runs],
            "server_tokens": [m.tokens for m in self.server_runs],
            "identical_outputs": self.identical_outputs,
            "direct_first_token_s": [
                [round(x, 3) for x in m.first_token_s] for m in self.direct_runs
            ],
            "server_first_token_s": [
                [round(x, 3) for x in m.first_token_s] for m in self.server_runs
            ],
            "first_token": first_token_stats(
                [m.first_token_s for m in self.direct_runs],
                [m.first_token_s for m in self.server_runs],
                [m.request_first_s for m in self.direct_runs],
                [m.request_first_s for m in self.server_runs],
            ),
            "whole": None
            if not self.whole_runs
            else {
                "server_tok_s": statistics.median(m.tokens_per_second for m in self.whole_runs),
                "ratio": statistics.median(self.whole_ratios),
                "paired_ratios": [round(r, 3) for r in self.whole_ratios],
            },
            "cpu_s_per_1k_tokens": {
                "direct_process": per_kilotoken(self.direct_runs, "cpu_s"),
                "server_process": per_kilotoken(self.server_runs, "cpu_s"),
                "bench_clients": per_kilotoken(self.server_runs, "client_cpu_s"),
                "server_trio_thread": per_kilotoken(self.server_runs, "trio_cpu_s"),
            },
        }


def preload_openblas() -> bool:
    """OpenBLAS for the direct side too, as the server's entry point loads it (``src/blas.py``;
    ``MLX_RESPONSES_OPENBLAS=0`` skips it on both sides). Before anything imports mlx."""
    if os.environ.get("MLX_RESPONSES_OPENBLAS", "1").lower() in ("0", "false", "no", "off"):
        return False
    import ctypes

    try:
        ctypes.CDLL("libopenblas.so.0", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def openblas_mapped(pid: int | str = "self") -> bool | None:
    """Whether process ``pid`` has OpenBLAS mapped (None: cannot tell, not Linux)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return any("libopenblas" in line for line in maps)
    except OSError:
        return None


def machine_facts() -> dict[str, Any]:
    from importlib.metadata import version

    import mlx.core as mx

    try:
        load = os.getloadavg()
    except OSError:
        load = (math.nan, math.nan, math.nan)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "device": str(mx.default_device()),
        "load_average_at_start": [round(x, 2) for x in load],
    }


def model_facts(path: str) -> dict[str, Any]:
    import mlx.core as mx

    config = json.loads((Path(path) / "config.json").read_text())

    params = sum(
        int(w.size)
        for file in Path(path).glob("*.safetensors")
        for w in mx.load(str(file)).values()
    )
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
    return {"path": path, "parameters": params, **{k: config.get(k) for k in keys}}


def print_report(report: dict[str, Any]) -> None:
    model = report["model"]
    print()
    print(
        f"model {Path(model['path']).name}: {model['parameters'] / 1e6:.1f}M parameters, "
        f"max_tokens {report['max_tokens']}, {report.get('turns', 1)} turns per stream, "
        f"{report['repeats']} repeats (medians)"
    )
    header = (
        f"{'concurrency':>11}  {'direct tok/s':>12}  {'server tok/s':>12}  {'server/direct':>13}"
        f"  {'per repeat':<18}  {'CPU ratio':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in report["throughput"]:
        paired = ", ".join(f"{r:.2f}" for r in row["paired_ratios"])
        print(
            f"{row['concurrency']:>11}  {row['direct_tok_s']:>12.1f}  {row['server_tok_s']:>12.1f}"
            f"  {row['ratio']:>13.2f}  {paired:<18}  {row['cpu_ratio']:>9.2f}"
        )
    print(
        "(tok/s: medians; server/direct: median of the per-repeat ratios; CPU ratio: direct CPU "
        "per token / server CPU per token)"
    )
    for row in report["throughput"]:
        if (whole := row.get("whole")) is not None:
            paired = ", ".join(f"{r:.2f}" for r in whole["paired_ratios"])
            print(
                f"{row['concurrency']:>11}  answered whole (--whole): {whole['server_tok_s']:.1f}"
                f" tok/s, server/direct {whole['ratio']:.2f} ({paired}); streamed "
                f"{row['ratio']:.2f}: the delta stream's share is the difference"
            )
    print()
    print("\n".join(first_token_lines(report["throughput"])))
    print()
    print(
        "CPU seconds per 1000 tokens (medians): direct process | server process "
        "(its Trio thread) | bench clients"
    )
    for row in report["throughput"]:
        cpu = row["cpu_s_per_1k_tokens"]
        print(
            f"{row['concurrency']:>11}  {cpu['direct_process']:>6.2f} | "
            f"{cpu['server_process']:>6.2f} ({cpu['server_trio_thread']:>5.2f}) | "
            f"{cpu['bench_clients']:>6.2f}"
        )
    for name, data in report["disconnect"].items():
        step = data["background_decode_step_ms"]
        note = f" (a decode step with the background streams: {step:.0f} ms)" if step else ""
        print(
            f"disconnect -> sequence cancelled ({name}, {data['runs']} runs): "
            f"p50 {data['p50_ms']:.1f} ms, p99 {data['p99_ms']:.1f} ms, "
            f"max {data['max_ms']:.1f} ms{note}"
        )
    for row in report["throughput"]:
        if row["concurrency"] in (1, TARGET_CONCURRENCY):
            print(headline(row))
    target = report["target"]
    if target["measured"] is None:
        verdict = "NOT MEASURED"
    else:
        verdict = "HOLDS" if target["holds"] else "DOES NOT HOLD"
    print(
        f"target server/direct >= {target['ratio']} at {target['concurrency']} streams: "
        f"{verdict}" + (f" ({target['measured']:.2f})" if target["measured"] is not None else "")
    )
    server = report["server"]
    print(
        f"server exit code on SIGTERM: {server['exit_code']}"
        + (" (killed after the grace period)" if server["killed"] else "")
    )
    print(f"results: {report['results_file']}")


def describe(side: str, m: Measurement) -> str:
    first, last = m.first_token_s
    return (
        f"{side} {m.tokens_per_second:6.1f} tok/s ({m.tokens} tok, {m.seconds:5.2f} s, "
        f"first tokens {first:.2f}-{last:.2f} s)"
    )


# -- main ----------------------------------------------------------------------------------------


def resolve_model(path: str | None) -> str:
    if path:
        return str(Path(path).resolve())
    try:
        return str(make_bench_model())
    except FileNotFoundError:
        existing = sorted(MODELS_DIR.glob("qwen3-random-*m"))
        if len(existing) == 1 and (existing[0] / "model.safetensors").is_file():
            return str(existing[0])
        raise


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated stream counts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="requests per stream, one after another (a longer, steadier window: one user's "
        "successive turns; each turn's own overhead is inside the measured time)",
    )
    parser.add_argument("--disconnects", type=int, default=30, help="disconnect runs per load")
    parser.add_argument("--background", type=int, default=3, help="streams for the loaded runs")
    parser.add_argument(
        "--server-command",
        default=None,
        help="command that starts the server, before 'serve' (default: the mlx-responses "
        "script next to this Python); e.g. 'python -m cProfile -o out.prof -m mlx_responses.cli'",
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="also time the server answering the same requests whole (stream false) in each "
        "repeat: its ratio against the streamed one is what the delta stream costs",
    )
    parser.add_argument(
        "--prompt-cache",
        action="store_true",
        help="keep the server's prompt cache on (by default it is off: every repeat sends the "
        "same prompts, which a cache would serve, while the direct side prefills them)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="after the measured repeats, one more server run and direct run per concurrency "
        "under py-spy: raw files and per-thread summaries in DIR (bench/profiling.py)",
    )
    parser.add_argument(
        "--py-spy",
        default=None,
        metavar="PATH",
        help="the py-spy program for --profile (default: on PATH, else /tmp/pyspy/bin/py-spy)",
    )
    args = parser.parse_args(argv)
    py_spy = find_py_spy(args.py_spy) if args.profile else None
    # Ctrl-C and SIGTERM unwind through ``running_server``'s ``finally``, which stops the server
    # (started in its own session, so it does not receive the terminal's signals itself).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    command = shlex.split(args.server_command) if args.server_command else default_server_command()

    preload_openblas()
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model(args.model)
    facts = machine_facts()
    print(f"model: {model_path}")
    documented = use_documented_prompt(model_path)
    if documented is not None:
        print(f"prompt: the model's documented long prompt, every stream: {documented!r}")
    print(f"machine: {facts['cpu']} x{facts['cpu_count']}, load {facts['load_average_at_start']}")

    direct = DirectRunner(model_path)
    rows = {c: Row(c) for c in concurrencies}
    disconnect: dict[str, dict[str, Any]] = {}
    log_path = RESULTS_DIR / f"server-{stamp}.log"
    extra = () if args.prompt_cache else ("--prompt-cache-bytes", "0")
    with running_server(command, model_path, log_path, extra_args=extra) as server:
        print(f"server: {server.base_url} (log {log_path.relative_to(ROOT)})")
        facts["openblas"] = {
            "direct": openblas_mapped(),
            "server": openblas_mapped(server.process.pid),
        }
        print(f"OpenBLAS mapped: {facts['openblas']}", flush=True)
        # The thread count the server set at load (--blas-threads, measured by default).
        facts["server_blas"] = httpx.get(server.base_url + "/health", timeout=30).json()["blas"]
        print(f"server OpenBLAS threads: {facts['server_blas']}", flush=True)
        # Warm-up: JIT-compiled CPU kernels and first-use paths on both sides.
        warm = max(concurrencies)
        direct.run(1, 8)
        direct.run(warm, 8)
        trio.run(server_run, server.base_url, 1, 8)
        trio.run(server_run, server.base_url, warm, 8)

        for repeat in range(args.repeats):
            for c in concurrencies:
                row = rows[c]
                sides = ("direct", "server", "whole") if args.whole else ("direct", "server")
                order = sides if repeat % 2 == 0 else sides[::-1]
                got: dict[str, Measurement] = {}
                for side in order:
                    # Let the other side's worker threads (OpenBLAS, MLX) stop spinning first:
                    # they would otherwise take cores from this side's run.
                    time.sleep(SETTLE_SECONDS)
                    if side == "direct":
                        cpu = time.process_time()
                        got[side] = direct.run(c, args.max_tokens, args.turns)
                        got[side].cpu_s = time.process_time() - cpu
                    else:
                        pid = server.process.pid
                        cpu, server_cpu = time.process_time(), process_cpu(pid)
                        trio_cpu = process_cpu(pid, pid)
                        got[side] = trio.run(
                            server_run,
                            server.base_url,
                            c,
                            args.max_tokens,
                            args.turns,
                            side == "whole",
                        )
                        got[side].cpu_s = process_cpu(pid) - server_cpu
                        got[side].trio_cpu_s = process_cpu(pid, pid) - trio_cpu
                        got[side].client_cpu_s = time.process_time() - cpu
                row.direct_runs.append(got["direct"])
                row.server_runs.append(got["server"])
                if "whole" in got:
                    row.whole_runs.append(got["whole"])
                same = sum(
                    a == b
                    for a, b in zip(got["direct"].outputs, got["server"].outputs, strict=True)
                )
                row.identical_outputs.append(same)
                ratio = got["server"].tokens_per_second / got["direct"].tokens_per_second
                whole = ""
                if "whole" in got:
                    w = got["whole"].tokens_per_second / got["direct"].tokens_per_second
                    whole = f"  whole {got['whole'].tokens_per_second:6.1f} tok/s, ratio {w:.2f}"
                print(
                    f"repeat {repeat + 1}/{args.repeats} C={c:>2}: "
                    f"{describe('direct', got['direct'])}  {describe('server', got['server'])}  "
                    f"ratio {ratio:.2f}  identical text {same}/{c}{whole}",
                    flush=True,
                )

        if py_spy is not None:
            url, max_tokens = server.base_url, args.max_tokens
            profile_runs(
                args.profile,
                py_spy,
                concurrencies,
                [
                    (
                        "server",
                        server.process.pid,
                        lambda c: trio.run(server_run, url, c, max_tokens),
                    ),
                    ("direct", os.getpid(), lambda c: direct.run(c, max_tokens)),
                ],
                settle_s=SETTLE_SECONDS,
            )

        loads = [("idle", 0)]
        if args.background > 0:
            loads.append((f"{args.background} background streams", args.background))
        for name, background in loads if args.disconnects > 0 else []:
            latencies, step = trio.run(
                disconnect_latencies, server.base_url, args.disconnects, background
            )
            disconnect[name] = {
                "runs": len(latencies),
                "background_streams": background,
                "background_decode_step_ms": None if step is None else round(step * 1e3, 1),
                "p50_ms": percentile(latencies, 50) * 1e3,
                "p99_ms": percentile(latencies, 99) * 1e3,
                "max_ms": max(latencies) * 1e3,
                "samples_ms": [round(x * 1e3, 2) for x in latencies],
            }
            print(
                f"disconnects ({name}): p50 {disconnect[name]['p50_ms']:.1f} ms, "
                f"p99 {disconnect[name]['p99_ms']:.1f} ms",
                flush=True,
            )
    direct.close()

    target_row = rows.get(TARGET_CONCURRENCY)
    measured = target_row.ratio if target_row else None
    bundled = Path(model_path).resolve() == (ROOT / "src" / "engine" / "bundled").resolve()
    target_ratio = TARGET_RATIO_TINY if bundled else TARGET_RATIO_BENCH
    results_file = RESULTS_DIR / f"throughput-{stamp}.json"
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": facts,
        "model": model_facts(model_path),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "turns": args.turns,
        "batch_settings": {
            "completion_batch_size": COMPLETION_BATCH_SIZE,
            "prefill_batch_size": PREFILL_BATCH_SIZE,
            "prefill_step_size": PREFILL_STEP_SIZE,
        },
        "server_command": [*command, "serve", "...", *extra],
        "throughput": [row.as_json() for row in rows.values()],
        "disconnect": disconnect,
        "target": {
            "ratio": target_ratio,
            "concurrency": TARGET_CONCURRENCY,
            "measured": measured,
            "holds": measured is not None and measured >= target_ratio,
        },
        "server": {
            "exit_code": server.exit_code,
            "killed": server.killed,
            "log": str(log_path.relative_to(ROOT)),
        },
        "results_file": str(results_file.relative_to(ROOT)),
    }
    results_file.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
