"""Response store throughput, memory and disk: 10,000 stored responses per backend (memory,
SQLite, PostgreSQL) against a small and a big budget, all in one run; for PostgreSQL also the
cross-replica cancel latency (a second replica on the same database cancels jobs running on
the first).

Run::

    .venv/bin/python bench/store.py [--count 10000] [--gets 2000]
        [--small-bytes 8388608] [--big-bytes 2147483648] [--backends memory,sqlite,postgresql]

For each backend and byte budget, a fresh child process (so one run's heap cannot flatter the
other's; the SQLite file is a fresh one in a temporary folder):

1. starts the server in-process (``serve``: real Hypercorn, real store actors, the bundled model;
   ``--responses-store-max-entries`` = ``--count``, so only the byte budget binds);
2. warms the HTTP path with GETs of an unknown id, then reads the resident memory (``VmRSS`` of
   ``/proc/self/status``) after a garbage collection;
3. fills the store through the response store's handle (creating 10,000 responses through the
   model would take far longer than storing them): each record is what a real response stores,
   built by the real ``ResponseMachine``: the final object (~3 KB, ~1,500 characters of text), its
   input items (a ~1 KB user message with an instruction turn) and its full SSE event log for
   replay (one ``output_text.delta`` per ~4-character token);
4. reads the resident memory again, then times ``--gets`` sequential ``GET /v1/responses/{id}``
   of held responses through one keep-alive HTTP client (httpx2) and reports p50/p99.

Printed figures: put rate and put p50/p99 (time inside ``store.put`` only, not building the
records: the create overhead a durable commit adds), GET p50/p99 and rate, the bytes the store
holds (its estimate, the serialised JSON size), the bytes offered, the RSS growth, and for SQLite
the bytes on disk (the file after the store closed, WAL folded in) per response held; ratios
against the memory backend of the same budget, and RSS growth over the budget and the bytes
held. Results are also written to ``bench/results/store-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx2 as httpx
import trio

from mlx_responses.actors.model import ModelSettings
from mlx_responses.engine.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from mlx_responses.protocol.events.machine import Finish, ResponseMachine, Start, TextDelta
from mlx_responses.protocol.ids import new_id
from mlx_responses.protocol.objects import ResponseConfig, Usage
from mlx_responses.server import ServerHandle, ServerSettings, serve
from mlx_responses.storage.choice import MEMORY, StoreChoice
from mlx_responses.storage.interface import StoredResponse, StoreLimits
from mlx_responses.storage.memory import serialized_size

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
MIB = 1 << 20
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "lighthouse harbour storm keeper lantern signal tide beacon island evening morning sailors"
).split()


@dataclass(slots=True)
class Run:
    backend: str
    budget_bytes: int
    count: int
    gets: int
    entries: int
    held_bytes: int
    offered_bytes: int
    evictions: int
    put_seconds: float
    rss_before: int
    rss_after_fill: int
    rss_after_gets: int
    get_p50_ms: float
    get_p99_ms: float
    get_seconds: float
    get_cpu_seconds: float
    get_errors: int
    mean_get_body_bytes: float
    put_p50_ms: float = 0.0
    put_p99_ms: float = 0.0
    disk_bytes: int = 0
    cancel_p50_ms: float = 0.0
    cancel_p99_ms: float = 0.0

    @property
    def rss_growth(self) -> int:
        return self.rss_after_fill - self.rss_before


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def make_record(rng: random.Random, created_at: int) -> StoredResponse:
    """One stored response as the response actor stores it: final object, input, events."""
    config = ResponseConfig(
        model=BUNDLED_ALIAS,
        instructions="You are a helpful assistant who answers briefly and precisely.",
        max_output_tokens=512,
        temperature=0.7,
        metadata={"session": f"s{rng.randrange(10**6)}", "user": "bench"},
    )
    machine = ResponseMachine(new_id("resp"), config, created_at)
    events = machine.feed(Start())
    text = " ".join(rng.choice(WORDS) for _ in range(300))[:1500]
    for start in range(0, len(text), 4):  # a token is ~4 characters of English
        events += machine.feed(TextDelta(text[start : start + 4]))
    events += machine.feed(Finish("stop", Usage(400, len(text) // 4), created_at + 3))
    question = " ".join(rng.choice(WORDS) for _ in range(200))[:1000]
    items = (
        {
            "id": new_id("msg"),
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": config.instructions}],
        },
        {
            "id": new_id("msg"),
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": question}],
        },
    )
    return StoredResponse(machine.snapshot(), items, tuple(events))


async def measure(backend: str, budget: int, count: int, gets: int) -> Run:
    if backend == "postgresql":
        return await measure_postgresql(budget, count, gets)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as folder:
        path = os.path.join(folder, "store.sqlite3")
        store = MEMORY if backend == "memory" else StoreChoice("sqlite", path)
        run = await _measure(store, budget, count, gets)
        run.disk_bytes = 0 if backend == "memory" else folder_bytes(folder)
        return run


CANCELS = 20


async def measure_postgresql(budget: int, count: int, gets: int) -> Run:
    """The PostgreSQL backend (issue 15) on a real PostgreSQL server started here (the tests'
    ``PostgresServer``), then the cross-replica cancel latency with a second replica."""
    sys.path.insert(0, str(ROOT))
    import psycopg
    from tests.postgres import PostgresServer

    pg = PostgresServer()
    try:
        url = pg.new_database()
        store = StoreChoice("postgresql", url)
        cancels: list[float] = []
        run = await _measure(store, budget, count, gets, cancels=cancels)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM FULL responses")
            row = conn.execute("SELECT pg_total_relation_size('responses')").fetchone()
        run.disk_bytes = int(row[0]) if row else 0
        if cancels:
            q = statistics.quantiles(cancels, n=100)
            run.cancel_p50_ms, run.cancel_p99_ms = q[49] * 1000, q[98] * 1000
        return run
    finally:
        pg.stop()


async def cross_replica_cancels(server: ServerHandle, settings: ServerSettings) -> list[float]:
    """``CANCELS`` background jobs on ``server`` (replica A), each cancelled through a second
    replica B on the same database: seconds from B's cancel request to its answer (A has
    cancelled the job, freed its sequence and stored the cancelled record)."""
    seconds: list[float] = []
    body = {
        "model": BUNDLED_ALIAS,
        "input": "Count from 1 to 500.",
        "background": True,
        "max_output_tokens": 2000,
    }
    async with trio.open_nursery() as nursery:
        b: ServerHandle = await nursery.start(serve, settings)
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=60) as on_b,
        ):
            for _ in range(CANCELS):
                job = (await on_a.post("/v1/responses", json=body)).json()
                path = f"/v1/responses/{job['id']}"
                for _ in range(3000):  # until B sees it running (A published its events)
                    if (await on_b.get(path)).json()["status"] == "in_progress":
                        break
                    await trio.sleep(0.01)
                t0 = time.perf_counter()
                reply = await on_b.post(f"{path}/cancel")
                seconds.append(time.perf_counter() - t0)
                assert reply.json()["status"] == "cancelled", reply.text
                await server.model.wait_idle()
        b.shutdown()
    return seconds


def folder_bytes(folder: str) -> int:
    """The bytes of the files in ``folder`` (the store file, its WAL if any is left)."""
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


async def _measure(
    store: StoreChoice, budget: int, count: int, gets: int, cancels: list[float] | None = None
) -> Run:
    model = ModelSettings(model_path=str(BUNDLED_MODEL_PATH), alias=BUNDLED_ALIAS)
    settings = replace(
        ServerSettings(host="127.0.0.1", port=0, model=model, graceful_timeout=5),
        responses_store=StoreLimits(max_entries=count, max_bytes=budget, ttl_seconds=3600),
        store=store,
    )
    rng = random.Random(1234)
    async with trio.open_nursery() as nursery:
        server: ServerHandle = await nursery.start(serve, settings)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            for _ in range(50):  # warm the HTTP path before the baseline
                await http.get("/v1/responses/resp_unknown")
            gc.collect()
            rss_before = rss_bytes()

            ids: list[str] = []
            offered = 0
            put_seconds = 0.0
            put_latencies: list[float] = []
            created_at = int(time.time())
            for _ in range(count):
                record = make_record(rng, created_at)
                offered += serialized_size(record.to_json())
                t0 = time.perf_counter()
                await server.store.put(record)
                put_latencies.append(time.perf_counter() - t0)
                put_seconds += put_latencies[-1]
                ids.append(record.id)
            del record
            gc.collect()
            rss_after_fill = rss_bytes()
            stats = server.store.statistics()

            # Nothing is put while reading, so the held responses are the last ones stored.
            held = ids[len(ids) - stats.entries :]
            latencies: list[float] = []
            body_bytes = 0
            errors = 0
            started = time.perf_counter()
            cpu_started = time.process_time()
            for _ in range(gets):
                response_id = rng.choice(held)
                t0 = time.perf_counter()
                reply = await http.get(f"/v1/responses/{response_id}")
                latencies.append(time.perf_counter() - t0)
                body_bytes += len(reply.content)
                errors += reply.status_code != 200
            get_seconds = time.perf_counter() - started
            get_cpu_seconds = time.process_time() - cpu_started
            gc.collect()
            rss_after_gets = rss_bytes()
        if cancels is not None:
            cancels.extend(await cross_replica_cancels(server, settings))
        server.shutdown()

    quantiles = statistics.quantiles(latencies, n=100)
    put_quantiles = statistics.quantiles(put_latencies, n=100)
    return Run(
        backend=store.kind,
        put_p50_ms=put_quantiles[49] * 1000,
        put_p99_ms=put_quantiles[98] * 1000,
        budget_bytes=budget,
        count=count,
        gets=gets,
        entries=stats.entries,
        held_bytes=stats.bytes,
        offered_bytes=offered,
        evictions=stats.evictions,
        put_seconds=put_seconds,
        rss_before=rss_before,
        rss_after_fill=rss_after_fill,
        rss_after_gets=rss_after_gets,
        get_p50_ms=quantiles[49] * 1000,
        get_p99_ms=quantiles[98] * 1000,
        get_seconds=get_seconds,
        get_cpu_seconds=get_cpu_seconds,
        get_errors=errors,
        mean_get_body_bytes=body_bytes / max(1, gets),
    )


def run_child(backend: str, budget: int, count: int, gets: int) -> Run:
    """One measurement in a fresh interpreter, so earlier runs leave no heap behind."""
    command = [
        sys.executable,
        __file__,
        "--child",
        str(budget),
        "--backends",
        backend,
        "--count",
        str(count),
        "--gets",
        str(gets),
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child for budget {budget} failed:\n{out.stderr[-4000:]}")
    return Run(**json.loads(out.stdout.strip().splitlines()[-1]))


def mib(n: float) -> str:
    return f"{n / MIB:8.1f} MiB"


def report(runs: list[Run]) -> None:
    print(f"{'':28}" + "".join(f"{r.backend:>18}" for r in runs))
    print(f"{'':28}" + "".join(f"{f'budget {r.budget_bytes / MIB:g} MiB':>18}" for r in runs))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:28}" + "".join(f"{c:>18}" for c in cells))

    row("responses stored (put)", [f"{r.count}" for r in runs])
    row("bytes offered (JSON)", [mib(r.offered_bytes) for r in runs])
    row("mean record (JSON)", [f"{r.offered_bytes / r.count / 1024:.1f} KiB" for r in runs])
    row("put rate (store handle)", [f"{r.count / r.put_seconds:,.0f} /s" for r in runs])
    row("put p50 (create overhead)", [f"{r.put_p50_ms:.2f} ms" for r in runs])
    row("put p99", [f"{r.put_p99_ms:.2f} ms" for r in runs])
    row("entries held", [f"{r.entries}" for r in runs])
    row("bytes held (estimate)", [mib(r.held_bytes) for r in runs])
    row("evictions", [f"{r.evictions}" for r in runs])
    row("RSS before fill", [mib(r.rss_before) for r in runs])
    row("RSS after fill", [mib(r.rss_after_fill) for r in runs])
    row("RSS after GETs", [mib(r.rss_after_gets) for r in runs])
    row("RSS growth (fill)", [mib(r.rss_growth) for r in runs])
    row("GET p50", [f"{r.get_p50_ms:.2f} ms" for r in runs])
    row("GET p99", [f"{r.get_p99_ms:.2f} ms" for r in runs])
    row("GET rate (sequential)", [f"{r.gets / r.get_seconds:,.0f} /s" for r in runs])
    row("CPU per GET (both ends)", [f"{r.get_cpu_seconds / r.gets * 1000:.2f} ms" for r in runs])
    row("GET body (final object)", [f"{r.mean_get_body_bytes / 1024:.1f} KiB" for r in runs])
    row("GET errors", [f"{r.get_errors}" for r in runs])
    row(
        "on disk per response held",
        [f"{r.disk_bytes / max(1, r.entries):,.0f} B" if r.disk_bytes else "-" for r in runs],
    )
    row(
        "cancel via another replica",
        [
            f"{r.cancel_p50_ms:.0f}/{r.cancel_p99_ms:.0f} ms" if r.cancel_p50_ms else "-"
            for r in runs
        ],
    )
    print()
    print("ratios")
    base = {r.budget_bytes: r for r in runs if r.backend == "memory"}

    def against(r: Run, value: float, of_base: float) -> str:
        return f"{value / of_base:.2f}" if r.budget_bytes in base and of_base else "-"

    row(
        "put p50 / memory's",
        [against(r, r.put_p50_ms, base.get(r.budget_bytes, r).put_p50_ms) for r in runs],
    )
    row(
        "GET p50 / memory's",
        [against(r, r.get_p50_ms, base.get(r.budget_bytes, r).get_p50_ms) for r in runs],
    )
    row(
        "GET p99 / memory's",
        [against(r, r.get_p99_ms, base.get(r.budget_bytes, r).get_p99_ms) for r in runs],
    )
    row("RSS growth / budget", [f"{r.rss_growth / r.budget_bytes:.3f}" for r in runs])
    row("RSS growth / bytes held", [f"{r.rss_growth / max(1, r.held_bytes):.2f}" for r in runs])
    row("bytes held / budget", [f"{r.held_bytes / r.budget_bytes:.3f}" for r in runs])
    budgets = sorted({r.budget_bytes for r in runs})
    if len(budgets) == 2 and len({r.backend for r in runs}) == 1:
        small, big = (
            statistics.median(r.rss_growth for r in runs if r.budget_bytes == b) for b in budgets
        )
        held_small, held_big = (
            statistics.median(r.held_bytes for r in runs if r.budget_bytes == b) for b in budgets
        )
        print(
            f"big/small RSS growth (medians): {big / max(1, small):.1f}x; "
            f"big/small bytes held: {held_big / max(1, held_small):.1f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--gets", type=int, default=2_000)
    parser.add_argument("--small-bytes", type=int, default=8 * MIB)
    parser.add_argument("--big-bytes", type=int, default=2048 * MIB)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per budget, the order flipping each time"
    )
    parser.add_argument(
        "--backends",
        default="memory,sqlite,postgresql",
        help="comma-separated: memory, sqlite, postgresql",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.child is not None:
        run = trio.run(measure, backends[0], args.child, args.count, args.gets)
        print(json.dumps(asdict(run)))
        return

    runs: list[Run] = []
    for repeat in range(args.repeats):
        # The machine may be shared: alternate the order so that load hits all runs alike.
        order = [(b, budget) for budget in (args.small_bytes, args.big_bytes) for b in backends]
        for backend, budget in order if repeat % 2 == 0 else order[::-1]:
            runs.append(run_child(backend, budget, args.count, args.gets))
    runs.sort(key=lambda r: (r.budget_bytes, r.backend))
    report(runs)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"store-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"argv": sys.argv[1:], "runs": [asdict(r) for r in runs]}, indent=2))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
