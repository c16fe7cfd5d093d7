"""Issue 16: what OpenBLAS buys the server, and what scraping ``/metrics`` costs it.

Run::

    .venv/bin/python bench/operations.py [--model PATH] [--concurrency 16] [--max-tokens 64]
        [--repeats 2]

Each side is ``mlx-responses serve`` as a subprocess on the bench model (bench/throughput.py's
``running_server``), C concurrent streaming clients (``server_run``: tokens/s = output tokens
over the time from the first request to the last terminal event). In one run, alternating
the order every repeat, medians reported:

1. BLAS: the server with OpenBLAS preloaded by the entry point (``MLX_RESPONSES_OPENBLAS=1``,
   the default) against the reference BLAS (``MLX_RESPONSES_OPENBLAS=0``); the start-up log
   says which one each server used.
2. Scrape cost: on the OpenBLAS server, the same load with and without a client reading
   ``GET /metrics`` every second (the target: under 1% of throughput lost at 16 streams).

With ``--status-page`` it measures the status page instead (and nothing else): on one server,
the same load with and without one viewer following ``GET /status/events`` (what an open page
does: one view a second), alternating; and the server's CPU time over ``--idle-seconds`` with
no load, with and without the viewer (read from ``/proc/<pid>/stat``).

Results are printed and written to ``bench/results/operations-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (
    RESULTS_DIR,
    Measurement,
    default_server_command,
    resolve_model,
    running_server,
    server_run,
)


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


async def with_scraper(
    base_url: str, concurrency: int, max_tokens: int
) -> tuple[Measurement, list[float]]:
    """The load with a client reading /metrics every second; each scrape's round trip."""
    scrapes: list[float] = []
    result: list[Measurement] = []
    async with httpx.AsyncClient(timeout=30) as scraper:

        async def scrape_every_second(cancel: trio.CancelScope) -> None:
            with cancel:
                while True:
                    started = time.perf_counter()
                    reply = await scraper.get(base_url + "/metrics")
                    assert reply.status_code == 200
                    scrapes.append(time.perf_counter() - started)
                    await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            cancel = trio.CancelScope()
            nursery.start_soon(scrape_every_second, cancel)
            result.append(await server_run(base_url, concurrency, max_tokens))
            cancel.cancel()
    return result[0], scrapes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def follow_status(base_url: str, seen: list[int], cancel: trio.CancelScope) -> None:
    """One viewer of the status page: its event stream, each view's size in ``seen``."""
    with cancel:
        async with (
            httpx.AsyncClient(timeout=30) as viewer,
            viewer.stream("GET", base_url + "/status/events") as reply,
        ):
            assert reply.status_code == 200
            async for text in reply.aiter_lines():
                if text.startswith("data: "):
                    seen.append(len(text))


async def with_viewer(base_url: str, concurrency: int, max_tokens: int) -> tuple[Measurement, int]:
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        cancel = trio.CancelScope()
        nursery.start_soon(follow_status, base_url, seen, cancel)
        result = await server_run(base_url, concurrency, max_tokens)
        cancel.cancel()
    return result, len(seen)


async def idle_cpu(base_url: str, pid: int, seconds: float, viewer: bool) -> tuple[float, int]:
    """The server's CPU seconds over ``seconds`` of no load, with or without a viewer."""
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        cancel = trio.CancelScope()
        if viewer:
            nursery.start_soon(follow_status, base_url, seen, cancel)
            await trio.sleep(1.5)  # the stream is open and has sent its first view
        before = cpu_seconds(pid)
        await trio.sleep(seconds)
        used = cpu_seconds(pid) - before
        cancel.cancel()
    return used, (statistics.median(seen) if seen else 0)


def status_page_main(args: argparse.Namespace, model: str, command: list[str]) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    c, n = args.concurrency, args.max_tokens
    load: dict[str, list[float]] = {"viewer": [], "quiet": []}
    views: list[int] = []
    idle: dict[str, list[float]] = {"viewer": [], "quiet": []}
    view_bytes = 0
    log = RESULTS_DIR / f"operations-{stamp}" / "status-page.log"
    with running_server(command, model, log) as srv:
        trio.run(server_run, srv.base_url, c, n)  # warm-up
        for repeat in range(args.repeats):
            for mode in ["viewer", "quiet"] if repeat % 2 == 0 else ["quiet", "viewer"]:
                if mode == "viewer":
                    m, count = trio.run(with_viewer, srv.base_url, c, n)
                    views.append(count)
                else:
                    m = trio.run(server_run, srv.base_url, c, n)
                load[mode].append(m.tokens_per_second)
                print(f"{mode:>7} repeat {repeat}: {m.tokens_per_second:8.1f} tok/s")
        for repeat in range(args.repeats):
            for mode in ["viewer", "quiet"] if repeat % 2 == 0 else ["quiet", "viewer"]:
                used, size = trio.run(
                    idle_cpu, srv.base_url, srv.process.pid, args.idle_seconds, mode == "viewer"
                )
                view_bytes = max(view_bytes, int(size))
                idle[mode].append(used)
                print(f"{mode:>7} idle {repeat}: {used:.3f} CPU s in {args.idle_seconds:.0f} s")
    med = {k: statistics.median(v) for k, v in load.items()}
    per_second = (statistics.median(idle["viewer"]) - statistics.median(idle["quiet"])) / (
        args.idle_seconds
    )
    report = {
        "model": model,
        "concurrency": c,
        "max_tokens": n,
        "repeats": args.repeats,
        "tokens_per_second": load,
        "medians": med,
        "viewer_cost_under_load": 1 - med["viewer"] / med["quiet"],
        "views_received_under_load": views,
        "idle_cpu_seconds": idle,
        "idle_seconds": args.idle_seconds,
        "viewer_cpu_fraction_idle": per_second,
        "view_bytes": view_bytes,
    }
    print(
        f"one status-page viewer at {c} streams: {med['viewer']:.1f} vs {med['quiet']:.1f} "
        f"tok/s: {100 * report['viewer_cost_under_load']:+.2f}% cost"
    )
    print(
        f"idle: the viewer costs the server {1000 * per_second:.1f} ms of CPU per second "
        f"({100 * per_second:.2f}% of one core); a view is {view_bytes} bytes of JSON"
    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"operations-status-page-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")
    return 0


def blas_in_log(log: Path) -> str:
    text = log.read_text(errors="replace")
    if "with OpenBLAS" in text:
        return "OpenBLAS"
    if "with the reference BLAS" in text:
        return "reference"
    return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--status-page", action="store_true", help="measure the status page only")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    model = resolve_model(args.model)
    command = default_server_command()
    if args.status_page:
        return status_page_main(args, model, command)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = RESULTS_DIR / f"operations-{stamp}"
    c, n = args.concurrency, args.max_tokens
    blas: dict[str, list[float]] = {"openblas": [], "reference": []}
    scrape: dict[str, list[float]] = {"scraped": [], "quiet": []}
    mapped: dict[str, str] = {}
    round_trips: list[float] = []
    for repeat in range(args.repeats):
        order = ["openblas", "reference"] if repeat % 2 == 0 else ["reference", "openblas"]
        for side in order:
            flag = "1" if side == "openblas" else "0"
            log = logs / f"{side}-{repeat}.log"
            with (
                environment(MLX_RESPONSES_OPENBLAS=flag),
                running_server(command, model, log) as srv,
            ):
                trio.run(server_run, srv.base_url, c, n)  # warm-up
                m = trio.run(server_run, srv.base_url, c, n)
                blas[side].append(m.tokens_per_second)
                print(f"{side:>9} repeat {repeat}: {m.tokens_per_second:8.1f} tok/s")
                if side == "openblas":
                    pair = ["scraped", "quiet"] if repeat % 2 == 0 else ["quiet", "scraped"]
                    for mode in pair:
                        if mode == "scraped":
                            s, trips = trio.run(with_scraper, srv.base_url, c, n)
                            round_trips += trips
                        else:
                            s = trio.run(server_run, srv.base_url, c, n)
                        scrape[mode].append(s.tokens_per_second)
                        print(f"{mode:>9} repeat {repeat}: {s.tokens_per_second:8.1f} tok/s")
            mapped[side] = blas_in_log(log)
    med = {k: statistics.median(v) for k, v in {**blas, **scrape}.items()}
    report = {
        "model": model,
        "concurrency": c,
        "max_tokens": n,
        "repeats": args.repeats,
        "blas_seen_in_startup_log": mapped,
        "tokens_per_second": {**blas, **scrape},
        "medians": med,
        "openblas_speedup": med["openblas"] / med["reference"],
        "scrape_cost": 1 - med["scraped"] / med["quiet"],
        "scrapes": len(round_trips),
        "scrape_round_trip_seconds": sorted(round_trips),
    }
    print(f"BLAS seen by the servers: {mapped}")
    print(
        f"OpenBLAS {med['openblas']:.1f} tok/s vs reference BLAS {med['reference']:.1f} tok/s: "
        f"{report['openblas_speedup']:.2f}x at {c} streams"
    )
    print(
        f"/metrics every second: {med['scraped']:.1f} vs {med['quiet']:.1f} tok/s: "
        f"{100 * report['scrape_cost']:+.2f}% cost ({len(round_trips)} scrapes)"
    )
    if round_trips:
        trip = statistics.median(round_trips)
        print(
            f"a scrape's round trip under load: median {1000 * trip:.2f} ms, max "
            f"{1000 * max(round_trips):.2f} ms: at one a second, at most "
            f"{100 * trip:.2f}% of the server's time"
        )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"operations-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
