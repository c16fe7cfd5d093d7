"""One model on 1 rank against 2 ranks (tensor and pipeline parallel), in one run (issue 26).

Run::

    .venv/bin/python bench/sharded.py [--model PATH] [--tokens 48] [--streams 1,16] [--repeats 3]

The model is the bench model (``bench/make_bench_model.py``, made if missing; random weights
whose end-of-sequence logits are zero, so every stream generates exactly ``--tokens``) in
mlx-lm's qwen2 class (``tests/sharded.qwen2_copy``): the same weights can then be split both
ways (qwen3 has no pipeline split). Each configuration is the real ``mlx-responses serve``:
one process, then 2 ranks of MLX's ring backend on loopback, started as ``mlx.launch`` starts
them. For each, after a warm-up, N concurrent streamed greedy requests (N in ``--streams``):
tokens/s over the batch (output tokens over the wall time) and the median time to first
token (the run with the median tokens/s of ``--repeats``). On 2 ranks also rank 0's broadcast from ``/health`` over the measured runs: bytes per
step and steps.

Then the broadcast alone, on the same 2 ranks with nothing else running (``--exchange``): the
time of the exchange of a step that carries no message (its header alone: a 5-int all_sum on
2 ranks, the length and each rank's steps and batch size) and of one carrying
the mean message bytes seen per packet, against the mean step time of the 2-rank runs: the
per-step overhead of the broadcast as a share of a step.

On this machine (a CPU, both ranks on the same cores) 2 ranks cannot be faster than one: the
figures show the cost of splitting, not a speed-up. On Macs the split is for models that fit
no single machine. Results go to ``bench/results/sharded-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.engine.topology import header_length

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.sharded import Ranks, free_port, qwen2_copy, start_ranks, start_single  # noqa: E402

from make_bench_model import make_bench_model  # noqa: E402

ALIAS = "bench"
PROMPT = "Write a long story about a lighthouse keeper and the sea."
EXCHANGES = 400


async def _one_stream(base_url: str, tokens: int) -> tuple[float, int]:
    """Time to first text delta and output tokens of one streamed greedy request."""
    body = {
        "model": ALIAS,
        "input": PROMPT,
        "temperature": 0,
        "max_output_tokens": tokens,
        "stream": True,
    }
    started = time.perf_counter()
    first = 0.0
    raw = b""
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        async with http.stream("POST", "/v1/responses", json=body) as reply:
            async for chunk in reply.aiter_bytes():
                raw += chunk
                if not first and b"response.output_text.delta" in raw:
                    first = time.perf_counter() - started
    last = raw.rsplit(b"data: ", 1)[-1]
    usage = json.loads(last)["response"]["usage"]
    return first, int(usage["output_tokens"])


async def _run(base_url: str, streams: int, tokens: int) -> dict[str, float]:
    results: list[tuple[float, int]] = []

    async def one() -> None:
        results.append(await _one_stream(base_url, tokens))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
    wall = time.perf_counter() - started
    generated = sum(count for _, count in results)
    return {
        "streams": streams,
        "wall_seconds": round(wall, 3),
        "tokens": generated,
        "tokens_per_second": round(generated / wall, 1),
        "ttft_median_seconds": round(statistics.median(t for t, _ in results), 3),
    }


def _broadcast(base_url: str) -> dict[str, Any]:
    health = httpx.get(f"{base_url}/health", timeout=60).json()
    distributed = health.get("distributed")
    return {} if distributed is None else dict(distributed["broadcast"])


def measure(ranks: Ranks, label: str, args: argparse.Namespace) -> dict[str, Any]:
    trio.run(_run, ranks.base_url, 1, 4)  # warm-up: kernels and the batch's first shapes
    before = _broadcast(ranks.base_url)
    runs = []
    wall = 0.0  # every measured run's wall time: the steps counted happened within it
    for n in args.streams:
        # The median of --repeats runs (by tokens/s): one run on a shared machine is noise.
        tries = [trio.run(_run, ranks.base_url, n, args.tokens) for _ in range(args.repeats)]
        wall += sum(run["wall_seconds"] for run in tries)
        tries.sort(key=lambda run: run["tokens_per_second"])
        runs.append({**tries[len(tries) // 2], "repeats": len(tries)})
    after = _broadcast(ranks.base_url)
    result: dict[str, Any] = {"config": label, "runs": runs}
    if before:
        steps = after["steps"] - before["steps"]
        packets = after["packets"] - before["packets"]
        sent = after["bytes"] - before["bytes"]
        carrying = after["packets_with_messages"] - before["packets_with_messages"]
        result["broadcast"] = {
            "steps": steps,
            "bytes_per_step": round(sent / max(steps, 1), 1),
            "packets_with_messages": carrying,
            "header_bytes": after["header_bytes"],
            # What such a packet carries beyond its header.
            "message_bytes_per_packet": round(
                (sent - after["header_bytes"] * packets) / max(carrying, 1), 1
            ),
            # Each run's wall time over its steps: a step's mean length, queueing included.
            "step_seconds": round(wall / max(steps, 1), 6),
        }
    return result


def exchange(size: int) -> None:
    """``--exchange`` on one rank: time EXCHANGES step-only exchanges, then as many carrying
    ``size`` bytes, with nothing else running (rank 0 prints the figures)."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")

    def timed(make: Any) -> float:
        for _ in range(20):
            mx.eval(mx.distributed.all_sum(make(), group=group))
        started = time.perf_counter()
        for _ in range(EXCHANGES):
            mx.eval(mx.distributed.all_sum(make(), group=group))
        return (time.perf_counter() - started) / EXCHANGES

    header = header_length(group.size())
    step_only = timed(lambda: mx.zeros((header,), dtype=mx.int32))
    # A packet with messages: the header, then the bytes.
    carrying = step_only + timed(lambda: mx.zeros((max(size, 1),), dtype=mx.uint8))
    if group.rank() == 0:
        print(json.dumps({"step_only_seconds": step_only, "carrying_seconds": carrying}))


def run_exchange(size: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="sharded-bench-"))
    hosts = folder / "hosts.json"
    hosts.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(2)]))
    command = [sys.executable, __file__, "--exchange", str(size)]
    processes = [
        subprocess.Popen(
            command,
            env={**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hosts)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    out = processes[0].communicate(timeout=300)[0]
    processes[1].wait(60)
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a qwen3 model folder (default: the bench model)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exchange", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.exchange is not None:
        exchange(args.exchange)
        return 0
    args.streams = [int(n) for n in args.streams.split(",")]
    source = Path(args.model) if args.model else make_bench_model()
    model = qwen2_copy(ROOT / "bench" / "models" / f"{source.name}-qwen2", source)
    folder = Path(tempfile.mkdtemp(prefix="sharded-bench-"))
    results = []
    configs = [
        ("1 rank", lambda: start_single(model, folder, "--alias", ALIAS)),
        ("2 ranks, tensor", lambda: start_ranks(model, folder, "--alias", ALIAS)),
        ("2 ranks, pipeline", lambda: start_ranks(model, folder, "--alias", ALIAS, "--pipeline")),
    ]
    for label, start in configs:
        ranks = start()
        try:
            results.append(measure(ranks, label, args))
        finally:
            ranks.stop(120)
        print(json.dumps(results[-1]), flush=True)
    packet = statistics.mean(
        r["broadcast"]["message_bytes_per_packet"] for r in results if "broadcast" in r
    )
    alone = run_exchange(round(packet))
    step = statistics.mean(r["broadcast"]["step_seconds"] for r in results if "broadcast" in r)
    overhead = {
        **{k: round(v, 6) for k, v in alone.items()},
        "mean_packet_bytes": round(packet, 1),
        "mean_step_seconds": round(step, 6),
        "step_only_share_of_a_step": round(alone["step_only_seconds"] / step, 4),
    }
    print(json.dumps({"broadcast_alone": overhead}))
    _table(results, overhead)
    out = ROOT / "bench" / "results" / f"sharded-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": str(model), "results": results, "overhead": overhead}))
    print(f"written to {out}")
    return 0


def _table(results: list[dict[str, Any]], overhead: dict[str, Any]) -> None:
    base = {run["streams"]: run for run in results[0]["runs"]}
    print(f"\n{'config':<20} {'streams':>7} {'tok/s':>8} {'x 1 rank':>8} {'TTFT s':>8}")
    for result in results:
        for run in result["runs"]:
            ratio = run["tokens_per_second"] / base[run["streams"]]["tokens_per_second"]
            print(
                f"{result['config']:<20} {run['streams']:>7} {run['tokens_per_second']:>8} "
                f"{ratio:>8.2f} {run['ttft_median_seconds']:>8}"
            )
        if "broadcast" in result:
            b = result["broadcast"]
            print(f"{'':<20} broadcast: {b['bytes_per_step']} bytes/step over {b['steps']} steps")
    print(
        f"\nthe broadcast alone: {overhead['step_only_seconds'] * 1e6:.0f} us for a step with no "
        f"message, {overhead['carrying_seconds'] * 1e6:.0f} us with {overhead['mean_packet_bytes']}"
        f" bytes; {overhead['step_only_share_of_a_step']:.1%} of a mean step "
        f"({overhead['mean_step_seconds'] * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    sys.exit(main())
