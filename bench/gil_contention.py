"""Is the GIL between the Trio thread and the generation thread the cost?

Run::

    .venv/bin/python bench/gil_contention.py [--model PATH] [--max-tokens 256] [--repeats 5]
        [--duty 0.1,0.3,1.0] [--throughput-json FILE]

mlx-lm's BatchGenerator is driven directly on one stream (``throughput.py``'s ``DirectRunner``,
on this process's main thread; the model's documented long prompt, as ``throughput.py`` sends),
first alone, then with a second Python thread doing pure-Python work (``json.dumps`` of a dict
the size of one SSE text-delta event) for a share of every 2 ms (the duty cycle; it sleeps the
rest), each under ``sys.setswitchinterval`` 0.005 s (Python's default) and 0.0005 s (what the
server sets, ``GIL_SWITCH_INTERVAL_SECONDS`` in src/server.py). Conditions interleave, the order
rotating every repeat; medians are reported, with ratios to "alone" at the same switch interval
(paired per repeat: the two ran within seconds of each other).

``--where thread,process`` adds the same work in a second *process* (``BusyProcess``: its own
interpreter and GIL, on the same cores) at the server's switch interval: if the second process
costs decode as much as the second thread does, the cost is the cores, not the GIL, and moving
the engine into a process of its own would not remove it. ``--period`` sets the cycle (2 ms by
default; the server's Trio thread works in bursts of ~0.5-0.7 ms per text delta, one delta per
25 ms linger at one stream: ``--duty 0.024 --period 0.025``).

Per run: decode tok/s (tokens after the first, over the time from the first token to the last)
and time to first token (from ``insert``, prefill included). The busy thread's achieved duty
(its CPU time over the run's wall time) is printed too: under contention it gets less than asked.

The server's Trio thread imposes a duty of its own on the generation thread: from a
``throughput.py`` results file (``--throughput-json``; by default the newest in bench/results),
its Trio-thread CPU over the run's wall time at each concurrency is printed for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlx_responses.server import GIL_SWITCH_INTERVAL_SECONDS
from throughput import (
    RESULTS_DIR,
    ROOT,
    DirectRunner,
    openblas_mapped,
    preload_openblas,
    use_documented_prompt,
)

PERIOD_S = 0.002
PYTHON_DEFAULT_SWITCH_S = 0.005
SETTLE_S = 0.3
# One ``response.output_text.delta`` event, as the server encodes one per token.
EVENT = {
    "type": "response.output_text.delta",
    "sequence_number": 42,
    "item_id": "msg_0123456789abcdef0123456789abcdef",
    "output_index": 0,
    "content_index": 0,
    "delta": " forty-two,",
    "logprobs": [],
    "obfuscation": "a1b2c3d4",
}


class BusyThread(threading.Thread):
    """Pure-Python work for ``duty`` of every ``period`` seconds, sleeping the rest."""

    def __init__(self, duty: float, period: float = PERIOD_S) -> None:
        super().__init__(name="busy", daemon=True)
        self.duty = duty
        self.period = period
        self.stopping = threading.Event()
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def run(self) -> None:
        busy, idle = self.duty * self.period, (1 - self.duty) * self.period
        cpu, start = time.thread_time(), time.perf_counter()
        while not self.stopping.is_set():
            until = time.perf_counter() + busy
            while time.perf_counter() < until:
                json.dumps(EVENT)
            if idle > 0:
                time.sleep(idle)
        self.cpu_s, self.wall_s = time.thread_time() - cpu, time.perf_counter() - start


# The same loop in a process of its own; SIGTERM ends it and it prints its CPU and wall seconds.
_BUSY_PROCESS = """
import json, signal, sys, time
duty, period, event = float(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
busy, idle = duty * period, (1 - duty) * period
cpu, start = time.process_time(), time.perf_counter()
print("ready", flush=True)
while not stopping:
    until = time.perf_counter() + busy
    while time.perf_counter() < until:
        json.dumps(event)
    if idle > 0:
        time.sleep(idle)
print(time.process_time() - cpu, time.perf_counter() - start, flush=True)
"""


class BusyProcess:
    """``BusyThread``'s work in a second process: the same cores, another GIL."""

    def __init__(self, duty: float, period: float = PERIOD_S) -> None:
        self.args = [sys.executable, "-c", _BUSY_PROCESS, str(duty), str(period)]
        self.process: subprocess.Popen[str] | None = None
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.args, json.dumps(EVENT)], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.process.stdout.readline()  # "ready": its interpreter's start is not measured

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=30)
        cpu, wall = out.split()
        self.cpu_s, self.wall_s = float(cpu), float(wall)


@dataclass(frozen=True, slots=True)
class Condition:
    switch_s: float
    duty: float  # 0: alone
    where: str = "thread"  # or "process"

    @property
    def label(self) -> str:
        who = "alone" if self.duty == 0 else f"{self.where} busy {self.duty:.1%}"
        return f"switch {self.switch_s * 1e3:g} ms, {who}"


@dataclass(frozen=True, slots=True)
class Sample:
    decode_tok_s: float
    first_token_ms: float
    achieved_duty: float


def run_once(
    direct: DirectRunner, condition: Condition, max_tokens: int, period: float = PERIOD_S
) -> Sample:
    sys.setswitchinterval(condition.switch_s)
    busy: BusyThread | BusyProcess | None = None
    if condition.duty > 0:
        kind = BusyProcess if condition.where == "process" else BusyThread
        busy = kind(condition.duty, period)
        busy.start()
    try:
        m = direct.run(1, max_tokens)
    finally:
        if busy is not None:
            busy.stop()
    first = m.first_token_s[0]
    decode = (m.tokens - 1) / (m.seconds - first) if m.tokens > 1 and m.seconds > first else 0.0
    achieved = busy.cpu_s / busy.wall_s if busy is not None and busy.wall_s else 0.0
    return Sample(decode, first * 1e3, achieved)


def server_trio_duty(path: Path | None) -> tuple[Path | None, list[tuple[int, float]]]:
    """(file, [(concurrency, Trio-thread CPU s per wall s)]) from a throughput.py results file."""
    if path is None:
        found = sorted(RESULTS_DIR.glob("throughput-*.json"))
        path = found[-1] if found else None
    if path is None or not path.is_file():
        return path, []
    rows = json.loads(path.read_text())["throughput"]
    duties = []
    for row in rows:
        per_kilotoken = row["cpu_s_per_1k_tokens"]["server_trio_thread"]
        # CPU s per token x tokens per second: the thread's busy share of the run's wall time.
        duties.append((int(row["concurrency"]), per_kilotoken / 1000 * row["server_tok_s"]))
    return path, duties


def report(
    conditions: list[Condition], samples: dict[Condition, list[Sample]], repeats: int
) -> None:
    header = (
        f"{'condition':<26}  {'decode tok/s':>12}  {'ratio':>6}  {'first token ms':>14}"
        f"  {'ratio':>6}  {'busy got':>8}"
    )
    print(header)
    print("-" * len(header))
    for c in conditions:
        alone = samples[Condition(c.switch_s, 0.0)]
        mine = samples[c]
        decode = statistics.median(s.decode_tok_s for s in mine)
        first = statistics.median(s.first_token_ms for s in mine)
        decode_ratio = statistics.median(
            s.decode_tok_s / a.decode_tok_s for s, a in zip(mine, alone, strict=True)
        )
        first_ratio = statistics.median(
            s.first_token_ms / a.first_token_ms for s, a in zip(mine, alone, strict=True)
        )
        got = statistics.median(s.achieved_duty for s in mine) if c.duty else 0.0
        print(
            f"{c.label:<26}  {decode:>12.1f}  {decode_ratio:>6.2f}  {first:>14.2f}"
            f"  {first_ratio:>6.2f}  {got:>8.0%}"
        )
    fast, slow = (
        samples[Condition(x, 0.0)] for x in (GIL_SWITCH_INTERVAL_SECONDS, PYTHON_DEFAULT_SWITCH_S)
    )
    alone_ratio = statistics.median(
        f.decode_tok_s / s.decode_tok_s for f, s in zip(fast, slow, strict=True)
    )
    print(
        f"alone, switch {GIL_SWITCH_INTERVAL_SECONDS * 1e3:g} ms / switch 5 ms: decode {alone_ratio:.2f}"
    )
    print(
        f"(medians of {repeats} repeats; ratio: the median of the per-repeat ratios to 'alone' "
        "at the same switch interval; busy got: the busy thread's CPU / wall)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default=str(ROOT / "src" / "engine" / "bundled"))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duty", default="0.1,0.3,1.0", help="busy shares of every period")
    parser.add_argument("--period", type=float, default=PERIOD_S, help="the busy cycle, seconds")
    parser.add_argument(
        "--where",
        default="thread",
        help="where the busy work runs: thread, process or both (comma-separated)",
    )
    parser.add_argument("--throughput-json", type=Path, default=None)
    args = parser.parse_args(argv)
    preloaded = preload_openblas()
    model = str(Path(args.model).resolve())
    prompt = use_documented_prompt(model)
    direct = DirectRunner(model)
    print(f"model: {model}; prompt: {prompt!r}; max_tokens {args.max_tokens}")
    print(f"OpenBLAS: preloaded {preloaded}, mapped {openblas_mapped()}")
    duties = [0.0, *(float(d) for d in args.duty.split(",") if d.strip())]
    switches = [PYTHON_DEFAULT_SWITCH_S, GIL_SWITCH_INTERVAL_SECONDS]
    wheres = [w.strip() for w in args.where.split(",") if w.strip()]
    # Alone at each switch interval; a busy thread at each; a busy process (its own GIL: the
    # switch interval of this one does not touch it) at the server's only.
    conditions = [
        Condition(s, d, w)
        for s in switches
        for w in ("thread", "process")
        for d in duties
        if (d == 0 and w == "thread")
        or (d > 0 and w in wheres and (w == "thread" or s == GIL_SWITCH_INTERVAL_SECONDS))
    ]
    samples: dict[Condition, list[Sample]] = {c: [] for c in conditions}
    original = sys.getswitchinterval()
    try:
        direct.run(1, 8)  # warm-up: compiled kernels, first-use paths
        for repeat in range(args.repeats):
            shift = repeat % len(conditions)
            for c in conditions[shift:] + conditions[:shift]:
                time.sleep(SETTLE_S)
                samples[c].append(run_once(direct, c, args.max_tokens, args.period))
            print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    finally:
        sys.setswitchinterval(original)
        direct.close()
    report(conditions, samples, args.repeats)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = RESULTS_DIR / f"gil-contention-{stamp}.json"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    record = {
        "model": model,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "openblas": {"preloaded": preloaded, "mapped": openblas_mapped()},
        "conditions": [
            {
                "switch_s": c.switch_s,
                "duty": c.duty,
                "where": c.where,
                "period_s": args.period,
                "samples": [dataclasses.asdict(x) for x in samples[c]],
            }
            for c in conditions
        ],
    }
    results.write_text(json.dumps(record, indent=2) + "\n")
    print(f"results: {results}")
    source, trio_duties = server_trio_duty(args.throughput_json)
    if trio_duties:
        shares = ", ".join(f"{c} streams {d:.0%}" for c, d in trio_duties)
        print(f"the server's Trio thread, CPU / wall ({source}): {shares}")
    else:
        print("no throughput.py results file: run bench/throughput.py to compare the duty the")
        print("server's Trio thread imposes (its CPU / wall) with the rows above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
