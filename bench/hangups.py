"""Hang-ups under load: streaming creates whose clients leave at random points.

Run::

    .venv/bin/python bench/hangups.py [--requests 10000] [--concurrency 16] [--normal 100]
        [--max-sequences N] [--busy N] [--repeats 1] [--stall 10] [--model PATH]
        [--seed 11] [--server-command CMD]

The storm the issue names (a small batch, a busy neighbour)::

    .venv/bin/python bench/hangups.py --requests 1000 --max-sequences 4 --busy 1

``mlx-responses serve`` runs as a subprocess (the bundled model by default: the point is the
server's books, not the model's speed), with ``--max-sequences`` when given; ``--busy`` starts
that many processes that only burn CPU beside it, so the server's threads are preempted at
arbitrary points. ``--requests`` streaming creates are sent over raw TCP, ``--concurrency`` at
a time; each client hangs up at a point drawn at random:

- a third **before the first byte** of the answer: right after sending the request, or after a
  random wait of up to 2 ms (while the body is read, the prompt rendered, the sequence admitted
  or the response start sent);
- a third **after the response start** (the status line and headers, or the first events);
- a third **mid-stream**, after 1 to 40 events.

A client that waits for a byte records how long the first one took; one that waits ``--stall``
seconds gives up and counts as **stalled** (a refusal, 503 while the batch is full, is a byte
too: a full batch must answer at once, not keep a client waiting).

Then, measured from the last hang-up: the time until ``/health`` shows an empty batch, no
admission and no response task (and how many generation-thread publications that took, and how
many sequences finished meanwhile: with every client gone, those generated unread), and
then ``--normal`` ordinary streaming requests, one at a time, whose status codes and waits for
the first byte are recorded (a leaked admission shows as 503 ``server_overloaded`` once
``--max-sequences`` leak). Resident memory of the server before (after a warm-up) and after is
read from ``/proc``. Nothing here is a timing target; the figures that must hold, per repeat:

- **later requests served**: every one of the ``--normal`` requests after the storm got 200;
- **longest wait for a first byte** under ``--stall`` (no stalled stream), storm and later
  requests alike;
- 0 leaked admissions, 0 leaked tasks.

Figures are printed and written to ``bench/results/hangups-<timestamp>.json``; ``verdict``
says whether every repeat held.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import RESULTS_DIR, default_server_command, machine_facts, running_server

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "src" / "engine" / "bundled"
COUNT = "Count from 1 to 110."
HELLO = "Reply with: hello"
TERMINAL = (b"response.completed", b"response.failed", b"response.incomplete")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def request_bytes(host: str, port: int, text: str) -> bytes:
    body = json.dumps({"model": "bench", "input": text, "stream": True, "temperature": 0})
    payload = body.encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Accept: text/event-stream\r\n\r\n"
    ).encode()
    return head + payload


@dataclass(slots=True)
class Storm:
    """What the storm's clients saw: where they left, their first bytes, their refusals."""

    points: dict[str, int] = field(default_factory=dict)
    first_byte_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    stalled: int = 0
    errors: int = 0

    def count(self, point: str) -> None:
        self.points[point] = self.points.get(point, 0) + 1


def status_of(head: bytes) -> int:
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def first_byte(stream: trio.SocketStream, stall: float, storm: Storm) -> bytes | None:
    """The first bytes of the answer, or None (counted as stalled) after ``stall`` seconds."""
    started = time.monotonic()
    with trio.move_on_after(stall):
        chunk = await stream.receive_some(65536)
        storm.first_byte_s.append(time.monotonic() - started)
        if chunk:
            status = status_of(chunk)
            storm.statuses[status] = storm.statuses.get(status, 0) + 1
        return chunk
    storm.stalled += 1
    return None


async def one_hang_up(
    host: str, port: int, rng: random.Random, index: int, stall: float, storm: Storm
) -> str:
    point = index % 3
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(request_bytes(host, port, COUNT))
        if point == 0:
            if rng.random() < 0.5:
                await trio.sleep(rng.uniform(0, 0.002))
            return "before the first byte"
        chunk = await first_byte(stream, stall, storm)
        if not chunk:
            return "stalled"
        if status_of(chunk) != 200:
            return "refused"
        if point == 1:
            return "after the response start"
        events, wanted = chunk.count(b"\n\n") - 1, rng.randint(1, 40)
        # A short answer can end before ``wanted`` events: the connection stays open after it.
        while events < wanted and not any(end in chunk for end in TERMINAL):
            with trio.move_on_after(stall):
                chunk = await stream.receive_some(65536)
            if not chunk:
                break
            events += chunk.count(b"\n\n")
        return "mid-stream"
    finally:
        await stream.aclose()


async def later_request(host: str, port: int, stall: float, storm: Storm) -> None:
    """One ordinary streaming create, read to its end (or until it stalls)."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(request_bytes(host, port, HELLO))
        chunk = await first_byte(stream, stall, storm)
        if chunk is None or status_of(chunk) != 200:
            return
        seen = chunk
        with trio.move_on_after(stall * 6):
            while not any(end in seen for end in TERMINAL):
                more = await stream.receive_some(65536)
                if not more:
                    break
                seen = seen[-64:] + more
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


def summary(storm: Storm) -> dict[str, Any]:
    waits = sorted(storm.first_byte_s)
    return {
        "statuses": storm.statuses,
        "stalled": storm.stalled,
        "first_byte_max_s": round(waits[-1], 3) if waits else None,
        "first_byte_p99_s": round(waits[int(0.99 * (len(waits) - 1))], 3) if waits else None,
    }


async def storm_phase(
    args: argparse.Namespace, host: str, port: int, rng: random.Random, storm: Storm
) -> None:
    limiter = trio.CapacityLimiter(args.concurrency)

    async def client(index: int) -> None:
        async with limiter:
            try:
                seed = random.Random(rng.random())
                storm.count(await one_hang_up(host, port, seed, index, args.stall, storm))
            except OSError:
                storm.errors += 1

    async with trio.open_nursery() as nursery:
        for index in range(args.requests):
            nursery.start_soon(client, index)


async def one_repeat(
    args: argparse.Namespace, http: httpx.AsyncClient, host: str, port: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    storm, later = Storm(), Storm()
    started = time.monotonic()
    await storm_phase(args, host, port, rng, storm)
    last_hang_up = time.monotonic()
    at_last = await health(http)
    now = at_last
    while leftovers(now) and time.monotonic() - last_hang_up < 30:
        await trio.sleep(0.001)
        now = await health(http)
    settle_s = time.monotonic() - last_hang_up
    for _ in range(args.normal):
        try:
            await later_request(host, port, args.stall, later)
        except OSError:
            later.errors += 1
    final = await health(http)
    served = later.statuses.get(200, 0) == args.normal and not later.stalled
    longest = max(storm.first_byte_s + later.first_byte_s, default=0.0)
    return {
        "seed": seed,
        "hang_up_points": storm.points,
        "client_errors": storm.errors + later.errors,
        "hang_up_phase_s": round(last_hang_up - started, 1),
        "storm": summary(storm),
        "leftover_at_last_hang_up": leftovers(at_last),
        "settle_after_last_hang_up_s": round(settle_s, 4),
        "publications_to_settle": now["batch"]["steps"] - at_last["batch"]["steps"],
        # Every client had left: a sequence that finished rather than being cancelled since
        # then generated unread (one admitted for a client that left while it was admitted).
        "finished_unread_after_last_hang_up": (
            now["batch"]["sequences_finished"] - at_last["batch"]["sequences_finished"]
        ),
        "leaked_after_settle": {
            "sequences": now["batch"]["active"],
            "admissions": now["batch"]["admitted"],
            "queued": now["batch"]["queued"],
            "response_tasks": now["responses"]["tasks"],
            "live_logs": now["responses"]["running"],
        },
        "later_requests": summary(later),
        "later_requests_served": served,
        "longest_first_byte_wait_s": round(longest, 3),
        "held": served and not storm.stalled and leftovers(now) == 0,
        "sequences_cancelled": final["batch"]["sequences_cancelled"],
        "sequences_finished": final["batch"]["sequences_finished"],
    }


async def run(args: argparse.Namespace, base_url: str, pid: int) -> dict[str, Any]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        for _ in range(3):  # warm-up: JIT, first allocations
            await http.post("/v1/responses", json={"model": "bench", "input": COUNT})
        rss_before = rss_kib(pid)
        repeats = []
        for repeat in range(args.repeats):
            result = await one_repeat(args, http, host, int(port), args.seed + repeat)
            print(json.dumps(result), flush=True)
            repeats.append(result)
        rss_after = rss_kib(pid)
    return {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_sequences": args.max_sequences,
        "busy": args.busy,
        "stall_s": args.stall,
        "verdict": {
            "repeats": len(repeats),
            "held": sum(1 for r in repeats if r["held"]),
            "later_requests_not_served": sum(1 for r in repeats if not r["later_requests_served"]),
            "with_a_stalled_stream": sum(1 for r in repeats if r["storm"]["stalled"]),
            "longest_first_byte_wait_s": max(r["longest_first_byte_wait_s"] for r in repeats),
        },
        "repeats": repeats,
        "rss_before_mib": round(rss_before / 1024, 1),
        "rss_after_mib": round(rss_after / 1024, 1),
        "rss_growth_mib": round((rss_after - rss_before) / 1024, 1),
    }


@contextlib.contextmanager
def busy_neighbours(count: int) -> Iterator[None]:
    """``count`` processes that only burn CPU, stopped on the way out."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--normal", type=int, default=100)
    parser.add_argument("--max-sequences", type=int, default=None)
    parser.add_argument("--busy", type=int, default=0, help="CPU-burning processes beside it")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stall", type=float, default=10.0, help="seconds without a first byte")
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--server-command", default=None)
    args = parser.parse_args()
    command = shlex.split(args.server_command) if args.server_command else default_server_command()
    extra = [] if args.max_sequences is None else ["--max-sequences", str(args.max_sequences)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = RESULTS_DIR / f"hangups-{stamp}.log"
    with (
        running_server(command, args.model, log_path, extra_args=extra) as server,
        busy_neighbours(args.busy),
    ):
        result = trio.run(run, args, server.base_url, server.process.pid)
    report = {"machine": machine_facts(), "model": args.model, **result}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"hangups-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(result["verdict"], indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
