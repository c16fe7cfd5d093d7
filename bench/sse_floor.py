"""How much of the server's event-loop CPU per streamed delta is the HTTP stack's own floor?

Run::

    .venv/bin/python bench/sse_floor.py [--model PATH] [--max-tokens 512] [--rounds 6]

Three things are measured in one run, interleaved round by round, the CPU of one thread each
(Linux ``/proc/PID/task/TID/schedstat``):

- **ours**: the server (``throughput.running_server``, one stream, the documented long prompt,
  greedy) answering one streamed request per round; its Trio thread's CPU over the SSE chunks
  the client read (every text delta and every other event: a chunk is one transport write,
  ``pipeline.follow``), and per request;
- **floor**: a 40-line Quart-Trio app on Hypercorn (this file, ``--serve-floor``) streaming the
  same number of chunks of a text delta's size over the same time, each chunk handed to the loop
  from a producer thread with ``TrioToken.run_sync_soon`` as the generation thread hands its
  tokens over: nothing of ours but the framework and the wake-ups;
- **wake-up**: a bare Trio loop in this process, woken at the same period by a thread with
  ``run_sync_soon`` and doing nothing else: what one wake-up of an idle loop costs on this
  machine (on a VM it is far from free).

It prints the medians per chunk and per request and ours over the floor. What ours spends above
the floor is its own work per delta (the event machine, the log, encoding) and per request
(parsing, rendering, admission, the store); the floor is what any Quart-Trio server pays.
Samples go to ``bench/results/sse-floor-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput

# One chunk as the server writes a text delta of a few tokens.
FLOOR_CHUNK = (
    "event: response.output_text.delta\ndata: "
    + json.dumps(
        {
            "type": "response.output_text.delta",
            "sequence_number": 12,
            "item_id": "msg_" + "0" * 48,
            "output_index": 0,
            "content_index": 0,
            "delta": " the quick brown fox jumps over the lazy dog" * 2,
            "logprobs": [],
        }
    )
    + "\n\n"
).encode()


def start_producer(count: int, period: float) -> Any:
    """A thread that hands ``count`` items to this Trio loop, one per ``period`` seconds, with
    ``TrioToken.run_sync_soon`` (as the generation thread hands over tokens), then closes the
    channel; the channel's receiving end. Call from the loop."""
    import trio

    token = trio.lowlevel.current_trio_token()
    send, receive = trio.open_memory_channel[int](count + 1)

    def produce() -> None:
        for index in range(count):
            time.sleep(period)
            token.run_sync_soon(send.send_nowait, index)
        token.run_sync_soon(send.close)

    threading.Thread(target=produce, daemon=True).start()
    return receive


def serve_floor(port: int) -> None:
    """The floor app: ``POST /stream?chunks=N&period=S`` streams N chunks, one per S seconds,
    each handed over from a producer thread (as the generation thread hands over tokens)."""
    import hypercorn.config
    import hypercorn.trio
    import trio
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("sse-floor")

    @app.route("/stream", methods=["POST"])
    async def stream() -> Response:
        await request.get_data()
        chunks = int(request.args["chunks"])
        period = float(request.args["period"])

        async def body() -> Any:
            receive = start_producer(chunks, period)
            async with receive:
                async for _ in receive:
                    yield FLOOR_CHUNK

        return Response(body(), mimetype="text/event-stream")

    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    sys.setswitchinterval(0.0005)  # as the server sets it (src/server.py)
    trio.run(hypercorn.trio.serve, app, config)  # type: ignore[arg-type]


def loop_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s main thread (its Trio loop), in nanoseconds' resolution."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def read_chunks(client: httpx.Client, url: str, body: dict[str, Any] | None) -> int:
    """Stream one answer; how many SSE chunks (events) it held."""
    count = 0
    with client.stream("POST", url, json=body or {}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                count += 1
    return count


def wake_up_cpu(period: float, count: int) -> float:
    """CPU seconds of this thread per wake-up of an otherwise idle Trio loop, woken every
    ``period`` by another thread with ``TrioToken.run_sync_soon`` (as the generation thread
    wakes the server's loop), the loop doing nothing else."""
    import trio

    async def loop() -> float:
        receive = start_producer(count, period)
        began = time.thread_time()
        for _ in range(count):
            await receive.receive()
        return (time.thread_time() - began) / count

    return trio.run(loop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--serve-floor", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_floor is not None:
        serve_floor(args.serve_floor)
        return 0
    openblas = throughput.preload_openblas()
    model = throughput.resolve_model(args.model)
    throughput.use_documented_prompt(model)
    print(f"OpenBLAS preloaded: {openblas}; model {model}")
    port = throughput.free_port()
    floor = subprocess.Popen(
        [sys.executable, __file__, "--serve-floor", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows: list[dict[str, float]] = []
    log = throughput.RESULTS_DIR / "sse-floor-server.log"
    try:
        with (
            throughput.running_server(throughput.default_server_command(), model, log) as server,
            httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client,
        ):
            floor_url = f"http://127.0.0.1:{port}/stream"
            deadline = time.monotonic() + 30
            while True:  # the floor app is up when it answers
                try:
                    read_chunks(client, floor_url + "?chunks=1&period=0", None)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            ours_url = server.base_url + "/v1/responses"
            body = throughput.request_body(0, args.max_tokens)
            read_chunks(client, ours_url, body)  # warm-up
            pid = server.process.pid
            for round_index in range(args.rounds):
                began, cpu = time.perf_counter(), loop_cpu(pid)
                chunks = read_chunks(client, ours_url, body)
                wall = time.perf_counter() - began
                ours = loop_cpu(pid) - cpu
                period = wall / chunks
                cpu = loop_cpu(floor.pid)
                floor_chunks = read_chunks(
                    client, f"{floor_url}?chunks={chunks}&period={period:.6f}", None
                )
                floor_cpu = loop_cpu(floor.pid) - cpu
                wake = wake_up_cpu(period, min(chunks, 100))
                rows.append(
                    {
                        "chunks": chunks,
                        "period_ms": period * 1e3,
                        "ours_request_ms": ours * 1e3,
                        "floor_request_ms": floor_cpu * 1e3,
                        "ours_chunk_us": ours / chunks * 1e6,
                        "floor_chunk_us": floor_cpu / max(floor_chunks, 1) * 1e6,
                        "wake_up_us": wake * 1e6,
                    }
                )
                print(
                    f"round {round_index + 1}/{args.rounds}: {chunks} chunks, one per "
                    f"{period * 1e3:.1f} ms; loop CPU per chunk: ours "
                    f"{rows[-1]['ours_chunk_us']:.0f} us, floor {rows[-1]['floor_chunk_us']:.0f} "
                    f"us; an idle loop's wake-up {rows[-1]['wake_up_us']:.0f} us"
                )
    finally:
        floor.terminate()
        floor.wait(timeout=30)

    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    print(
        f"\nmedians over {len(rows)} rounds (the loop thread's CPU, /proc schedstat):\n"
        f"  per chunk:   ours {median('ours_chunk_us'):.0f} us, floor "
        f"{median('floor_chunk_us'):.0f} us, ours/floor "
        f"{median('ours_chunk_us') / median('floor_chunk_us'):.2f}; "
        f"an idle Trio loop's wake-up {median('wake_up_us'):.0f} us\n"
        f"  per request: ours {median('ours_request_ms'):.1f} ms, floor "
        f"{median('floor_request_ms'):.1f} ms ({median('chunks'):.0f} chunks, one per "
        f"{median('period_ms'):.1f} ms)"
    )
    out = throughput.RESULTS_DIR / f"sse-floor-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"openblas": openblas, "model": model, "rounds": rows}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
