"""Hang-ups under load (issue 11): streaming creates whose clients leave at random points.

Run::

    .venv/bin/python bench/hangups.py [--requests 10000] [--concurrency 16] [--normal 100]
        [--model PATH] [--seed 11] [--server-command CMD]

``mlx-responses serve`` runs as a subprocess (the bundled model by default: the point is the
server's books, not the model's speed). ``--requests`` streaming creates are sent over raw
TCP, ``--concurrency`` at a time; each client hangs up at a point drawn at random:

- a third **before the first byte** of the answer: right after sending the request, or after a
  random wait of up to 2 ms (while the body is read, the prompt rendered, the sequence admitted
  or the response start sent);
- a third **after the response start** (the status line and headers, or the first events);
- a third **mid-stream**, after 1 to 40 events.

Then, measured from the last hang-up: the time until ``/health`` shows an empty batch, no
admission and no response task (and how many generation-thread publications that took), and
then ``--normal`` ordinary requests, whose status codes are counted (a leaked admission shows as
503 ``server_overloaded`` once 256 leak). Resident memory of the server before (after a warm-up)
and after is read from ``/proc``. Nothing here is a timing target: the figures that must hold
are 0 leaked admissions, 0 leaked tasks and 0 refusals.

Figures are printed and written to ``bench/results/hangups-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import RESULTS_DIR, default_server_command, machine_facts, running_server

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "src" / "engine" / "bundled"
COUNT = "Count from 1 to 110."


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def one_hang_up(host: str, port: int, rng: random.Random, index: int) -> str:
    body = json.dumps({"model": "bench", "input": COUNT, "stream": True, "temperature": 0})
    payload = body.encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Accept: text/event-stream\r\n\r\n"
    ).encode()
    point = index % 3
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(head + payload)
        if point == 0:
            if rng.random() < 0.5:
                await trio.sleep(rng.uniform(0, 0.002))
            return "before the first byte"
        if point == 1:
            await stream.receive_some(1)
            return "after the response start"
        events, wanted = 0, rng.randint(1, 40)
        while events < wanted:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            events += chunk.count(b"\n\n")
        return "mid-stream"
    finally:
        await stream.aclose()


async def health(http: httpx.AsyncClient) -> dict[str, Any]:
    data: dict[str, Any] = (await http.get("/health")).json()
    return data


def leftovers(data: dict[str, Any]) -> int:
    batch, books = data["batch"], data["responses"]
    return int(
        batch["active"] + batch["admitted"] + batch["queued"] + books["tasks"] + books["running"]
    )


async def run(args: argparse.Namespace, base_url: str, pid: int) -> dict[str, Any]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        for _ in range(3):  # warm-up: JIT, first allocations
            await http.post("/v1/responses", json={"model": "bench", "input": COUNT})
        rss_before = rss_kib(pid)
        points: dict[str, int] = {}
        errors = 0
        limiter = trio.CapacityLimiter(args.concurrency)
        started = time.monotonic()

        async def client(index: int) -> None:
            nonlocal errors
            async with limiter:
                try:
                    point = await one_hang_up(host, int(port), random.Random(rng.random()), index)
                    points[point] = points.get(point, 0) + 1
                except OSError:
                    errors += 1

        async with trio.open_nursery() as nursery:
            for index in range(args.requests):
                nursery.start_soon(client, index)
        last_hang_up = time.monotonic()
        at_last = await health(http)
        now = at_last
        while leftovers(now) and time.monotonic() - last_hang_up < 30:
            await trio.sleep(0.001)
            now = await health(http)
        settle_s = time.monotonic() - last_hang_up
        statuses: dict[int, int] = {}
        for _ in range(args.normal):
            reply = await http.post(
                "/v1/responses", json={"model": "bench", "input": "Reply with: hello"}
            )
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1
        final = await health(http)
        rss_after = rss_kib(pid)
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "hang_up_points": points,
        "client_errors": errors,
        "hang_up_phase_s": round(last_hang_up - started, 1),
        "leftover_at_last_hang_up": leftovers(at_last),
        "settle_after_last_hang_up_s": round(settle_s, 4),
        "publications_to_settle": now["batch"]["steps"] - at_last["batch"]["steps"],
        "leaked_after_settle": {
            "sequences": now["batch"]["active"],
            "admissions": now["batch"]["admitted"],
            "queued": now["batch"]["queued"],
            "response_tasks": now["responses"]["tasks"],
            "live_logs": now["responses"]["running"],
        },
        "normal_requests_statuses": statuses,
        "sequences_cancelled": final["batch"]["sequences_cancelled"],
        "sequences_finished": final["batch"]["sequences_finished"],
        "rss_before_mib": round(rss_before / 1024, 1),
        "rss_after_mib": round(rss_after / 1024, 1),
        "rss_growth_mib": round((rss_after - rss_before) / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--normal", type=int, default=100)
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--server-command", default=None)
    args = parser.parse_args()
    command = shlex.split(args.server_command) if args.server_command else default_server_command()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = RESULTS_DIR / f"hangups-{stamp}.log"
    with running_server(command, args.model, log_path) as server:
        result = trio.run(run, args, server.base_url, server.process.pid)
    report = {"machine": machine_facts(), "model": args.model, **result}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"hangups-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
