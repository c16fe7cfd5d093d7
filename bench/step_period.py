"""The decode step, timed inside both sides: mlx-lm's own step and the work around it.

Run::

    .venv/bin/python bench/step_period.py [--model PATH] [--concurrency 1] [--turns 4]
        [--max-tokens 512] [--rounds 6] [--whole]

Whole-run tok/s on a shared machine swing by 10-30% between repeats; the per-step figures do
not. Both sides run interleaved rounds as ``throughput.py`` does (the direct ``BatchGenerator``
in this process, the server started through ``step_recorder.py``), and every call of mlx-lm's
``BatchGenerator.next`` is timed on both. Over the decode steps (a call that returned tokens and
no prompt progress, after another such call) it prints, per side, the medians of:

- ``next()``: mlx-lm's step (the model's forward pass, sampling, its bookkeeping);
- between calls: everything the loop does from one step's end to the next step's start (the
  direct loop: reading the responses; the server: delivering tokens to the slots, the intake,
  the statistics);
- the period (their sum), and direct's period over the server's: the steady decode ratio, what
  the per-token work costs apart from each request's own start and end.

Medians hide what happens on few steps. So, per run (each side's measured window: from the
first request to the last token, as the tok/s count it), it also
splits the wall time into the time inside ``next()`` and the time outside it, and sorts the
gaps between calls by size (under 30 us: the loop's own work; 2 ms and up: mostly the time
between a turn's end and the next turn's first step, a request's round trip on the server),
medians over the rounds. What the server adds is the difference of the two sides: inside
``next()`` (the same steps, slowed by whatever else took the cores) and outside it. Per run
too: the calls that prefilled (returned prompt progress) and the time inside them, and the
tokens per call (the batch's mean occupancy). Direct inserts a stream's next prompt the step
its last one ends; the server gets it over HTTP, so its turns' prefills come in other groups,
beside the requests' own work on the cores.

With ``--whole`` the server answers each request as one JSON body (``stream: false``) instead
of streaming it: the same split, without the delta stream.

Also the runs' tok/s and their median ratio, as ``throughput.py`` reports them. Results go to
``bench/results/step-period-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402
from step_recorder import StepRecord, record_steps  # noqa: E402


@dataclass(frozen=True, slots=True)
class StepFigures:
    """Medians over the decode steps, in microseconds."""

    steps: int
    next_us: float
    between_us: float
    period_us: float

    def to_json(self) -> dict[str, Any]:
        return {
            "decode_steps": self.steps,
            "next_us": round(self.next_us, 1),
            "between_us": round(self.between_us, 1),
            "period_us": round(self.period_us, 1),
        }


def decode_figures(records: Sequence[Sequence[float]]) -> StepFigures | None:
    """The medians over each decode call that follows another decode call (the gap before it
    is the loop's own work between two steps); None without two such calls in a row."""
    durations: list[float] = []
    gaps: list[float] = []
    for before, after in itertools.pairwise(records):
        if all(record[2] > 0 and record[3] == 0 for record in (before, after)):
            durations.append(after[1] - after[0])
            gaps.append(after[0] - before[1])
    if not durations:
        return None
    periods = [d + g for d, g in zip(durations, gaps, strict=True)]
    return StepFigures(
        len(durations),
        statistics.median(durations) * 1e6,
        statistics.median(gaps) * 1e6,
        statistics.median(periods) * 1e6,
    )


GAP_BOUNDS_US = (30.0, 100.0, 500.0, 2000.0, 10000.0)


def gap_label(index: int) -> str:
    """The name of gap class ``index`` of ``GAP_BOUNDS_US`` (the last: above every bound)."""
    bounds = GAP_BOUNDS_US
    if index == 0:
        return f"<{bounds[0]:g}us"
    if index == len(bounds):
        return f">={bounds[-1] / 1000:g}ms"
    low, high = bounds[index - 1], bounds[index]
    return f"{low:g}-{high:g}us" if high < 1000 else f"{low / 1000:g}-{high / 1000:g}ms"


@dataclass(frozen=True, slots=True)
class RunSplit:
    """One run's window: its wall time, the part inside ``next()`` and the rest, in ms; the
    gaps between consecutive calls per class of ``GAP_BOUNDS_US`` (count, total ms); the calls
    that prefilled (returned prompt progress) and the ms inside them; the tokens generated."""

    wall_ms: float
    next_ms: float
    outside_ms: float
    steps: int
    gaps: tuple[tuple[int, float], ...]
    prompt_steps: int = 0
    prompt_ms: float = 0.0
    tokens: int = 0

    @property
    def tokens_per_step(self) -> float:
        """The batch's mean occupancy: tokens generated per call (a call that only prefilled
        counts as one that generated none)."""
        return self.tokens / self.steps if self.steps else 0.0


def run_split(records: Sequence[Sequence[float]], began: float, ended: float) -> RunSplit:
    """``records`` (``step_recorder``'s) of the calls that began in ``[began, ended]``."""
    mine = [r for r in records if began <= r[0] <= ended]
    inside = sum(r[1] - r[0] for r in mine)
    gaps = [[0, 0.0] for _ in range(len(GAP_BOUNDS_US) + 1)]
    for before, after in itertools.pairwise(mine):
        gap_us = (after[0] - before[1]) * 1e6
        index = sum(gap_us >= bound for bound in GAP_BOUNDS_US)
        gaps[index][0] += 1
        gaps[index][1] += gap_us / 1e3
    wall = ended - began
    prompted = [r for r in mine if r[3] > 0]
    return RunSplit(
        wall * 1e3,
        inside * 1e3,
        (wall - inside) * 1e3,
        len(mine),
        tuple((int(n), ms) for n, ms in gaps),
        len(prompted),
        sum(r[1] - r[0] for r in prompted) * 1e3,
        int(sum(r[2] for r in mine)),
    )


def median_split(splits: Sequence[RunSplit]) -> RunSplit:
    """Field by field medians of ``splits`` (not empty)."""
    return RunSplit(
        statistics.median(s.wall_ms for s in splits),
        statistics.median(s.next_ms for s in splits),
        statistics.median(s.outside_ms for s in splits),
        int(statistics.median(s.steps for s in splits)),
        tuple(
            (
                int(statistics.median(s.gaps[i][0] for s in splits)),
                statistics.median(s.gaps[i][1] for s in splits),
            )
            for i in range(len(GAP_BOUNDS_US) + 1)
        ),
        int(statistics.median(s.prompt_steps for s in splits)),
        statistics.median(s.prompt_ms for s in splits),
        int(statistics.median(s.tokens for s in splits)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--turns", type=int, default=4, help="requests per stream, in a row")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--whole", action="store_true", help="the server answers whole (stream false)"
    )
    args = parser.parse_args(argv)
    openblas = throughput.preload_openblas()
    model = throughput.resolve_model(args.model)
    throughput.use_documented_prompt(model)
    direct_records: list[StepRecord] = []
    record_steps(direct_records)
    direct = throughput.DirectRunner(model)
    started = time.strftime("%Y%m%d-%H%M%S")
    throughput.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    c, turns, max_tokens = args.concurrency, args.turns, args.max_tokens
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "server-steps.json"
        command = [sys.executable, str(BENCH / "step_recorder.py"), str(out)]
        log = throughput.RESULTS_DIR / f"server-{started}.log"
        with throughput.running_server(
            command, model, log, extra_args=("--prompt-cache-bytes", "0")
        ) as server:
            blas = throughput.httpx.get(server.base_url + "/health", timeout=30).json()["blas"]
            print(f"model {model}; OpenBLAS loaded: {openblas}; server OpenBLAS: {blas}")
            direct.run(c, 8)
            direct.run(c, max_tokens)
            whole = args.whole
            trio.run(throughput.server_run, server.base_url, c, 8, 1, whole)
            trio.run(throughput.server_run, server.base_url, c, max_tokens, 1, whole)
            # The warm-ups' steps are not counted: perf_counter is the system's monotonic
            # clock on Linux, so the server's records are cut at the same instant.
            rounds_began = time.perf_counter()
            rates: dict[str, list[float]] = {"direct": [], "server": []}
            windows: dict[str, list[tuple[float, float]]] = {"direct": [], "server": []}
            for round_index in range(args.rounds):
                order = ("direct", "server") if round_index % 2 == 0 else ("server", "direct")
                for side in order:
                    time.sleep(throughput.SETTLE_SECONDS)
                    if side == "direct":
                        m = direct.run(c, max_tokens, turns)
                    else:
                        m = trio.run(
                            throughput.server_run, server.base_url, c, max_tokens, turns, whole
                        )
                    windows[side].append((m.started_at, m.started_at + m.seconds))
                    rates[side].append(m.tokens / m.seconds)
                    print(f"round {round_index + 1} {side:6s} {m.tokens / m.seconds:8.1f} tok/s")
        server_records = json.loads(out.read_text()) if out.is_file() else []
    figures = {
        side: decode_figures([r for r in records if r[0] >= rounds_began])
        for side, records in (("direct", direct_records), ("server", server_records))
    }
    records_of = {"direct": direct_records, "server": server_records}
    splits = {
        side: median_split([run_split(records_of[side], a, b) for a, b in windows[side]])
        for side in windows
    }
    ratios = [s / d for d, s in zip(rates["direct"], rates["server"], strict=True)]
    answered = "answered whole" if args.whole else "streamed"
    print(
        f"\n{c} stream(s), {turns} turns, max_tokens {max_tokens}, {args.rounds} rounds, "
        f"the server's {answered}"
    )
    print(
        f"{'side':8s} {'decode steps':>12s} {'next() us':>10s} {'between us':>11s} {'period us':>10s}"
    )
    for side, found in figures.items():
        if found is None:
            print(f"{side:8s} no decode steps recorded")
            continue
        print(
            f"{side:8s} {found.steps:12d} {found.next_us:10.0f} {found.between_us:11.1f}"
            f" {found.period_us:10.0f}"
        )
    print("\nper run (medians over the rounds), ms: wall = inside next() + outside it")
    labels = [gap_label(i) for i in range(len(GAP_BOUNDS_US) + 1)]
    print(f"{'side':8s} {'wall':>8s} {'next()':>8s} {'outside':>8s}  gaps: count / ms")
    for side, split in splits.items():
        gaps = "  ".join(
            f"{label} {n}/{ms:.1f}" for label, (n, ms) in zip(labels, split.gaps, strict=True)
        )
        print(
            f"{side:8s} {split.wall_ms:8.1f} {split.next_ms:8.1f} {split.outside_ms:8.1f}  {gaps}"
        )
    print("\nper run (medians over the rounds): calls of next(), those that prefilled, tokens")
    print(
        f"{'side':8s} {'calls':>6s} {'prefilled':>9s} {'their ms':>9s} {'tokens':>7s} {'per call':>8s}"
    )
    for side, split in splits.items():
        print(
            f"{side:8s} {split.steps:6d} {split.prompt_steps:9d} {split.prompt_ms:9.1f}"
            f" {split.tokens:7d} {split.tokens_per_step:8.2f}"
        )
    report: dict[str, Any] = {
        "model": model,
        "concurrency": c,
        "turns": turns,
        "max_tokens": max_tokens,
        "rounds": args.rounds,
        "whole": args.whole,
        "openblas": openblas,
        "server_blas": blas,
        "steps": {k: None if v is None else v.to_json() for k, v in figures.items()},
        "tok_s": rates,
        "per_run_ms": {
            side: {
                "wall": round(split.wall_ms, 2),
                "next": round(split.next_ms, 2),
                "outside": round(split.outside_ms, 2),
                "calls": split.steps,
                "prefill_calls": split.prompt_steps,
                "prefill_ms": round(split.prompt_ms, 2),
                "tokens": split.tokens,
                "gaps": {
                    label: {"count": n, "ms": round(ms, 2)}
                    for label, (n, ms) in zip(labels, split.gaps, strict=True)
                },
            }
            for side, split in splits.items()
        },
        "run_ratio_median": statistics.median(ratios),
    }
    if figures["direct"] and figures["server"]:
        steady = figures["direct"].period_us / figures["server"].period_us
        report["steady_decode_ratio"] = round(steady, 3)
        print(f"steady decode: direct period / server period {steady:.3f}")
    print(
        f"runs: server/direct tok/s, median of the per-round ratios {statistics.median(ratios):.3f}"
        f" (per round {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    path = throughput.RESULTS_DIR / f"step-period-{started}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
