"""Cancellation under load: cancel latency with a full batch, and what the survivors keep.

Run::

    .venv/bin/python bench/cancellation.py [--model PATH] [--jobs 32] [--max-tokens 160]
        [--prefill-cancels 4] [--cancel-window 0.5] [--repeats 1] [--seed 5]
        [--poll-interval 0.01] [--server-command CMD]

``mlx-responses serve`` runs as a subprocess on the bench model (``bench/make_bench_model.py``;
random weights whose end-of-sequence logits are zero, so every job generates exactly
``--max-tokens``). A warm-up meets every batch size once. Each repeat then runs two phases on
the same server, back to back (the order flips every repeat):

1. **Alone**: only the survivors (half of the jobs, chosen at random) run as background jobs.
2. **Mixed**: all ``--jobs`` background jobs (same prompts, same ``max_output_tokens``) start
   together, and the other half are cancelled with ``POST /v1/responses/{id}/cancel`` at random
   moments: ``--prefill-cancels`` of them uniformly over the (estimated) prefill of the batch,
   the rest uniformly over the first ``--cancel-window`` x (the alone phase's decode time),
   counted from the moment every job is prefilled.

``GET /health`` is polled every ``--poll-interval`` s throughout (with the server's CPU time
from ``/proc``). Measured:

- **cancel -> terminal**: from sending the cancel request to its answer. The endpoint answers
  once the job is terminal, and a job becomes ``cancelled`` only once the generation thread has
  taken its sequence out of the batch (the thread pushes the ``cancelled`` finish when it
  applies the removal), so this bounds the time until the sequence left the batch.
- **cancel -> /health**: until a poll shows ``batch.sequences_cancelled`` grown (the k-th cancel
  sent is matched with the counter reaching k). The thread publishes its counters right after
  applying removals, so this is the removal itself, to within the polling interval.
- **the step it waited for**: removals are applied between batch steps, so a cancel waits for
  the step in flight when it reaches the thread (all of it, if it arrives just as one starts).
  That step is the last one to end (a change of the published state other than removals) at
  or before the sample that shows the removal, and began where the one before it ended; it is
  a *decode* step, or a *prefill* step (one prefill chunk, plus a decode step for the running
  sequences) when prompts were waiting or prefilling.
- **survivors' throughput**, while the batch holds exactly the survivors, all decoding (mixed:
  from the last removal until the first survivor finishes; alone: from the end of the prefill
  until the first finishes): tokens/s as the median over 1 s slices (and the mean), and server
  CPU milliseconds per token, which outside load on a shared machine barely moves. Also overall:
  the survivors' output tokens over the phase's wall time.

Targets (docs/benchmarks.md): p99 of cancel -> terminal within one decode step + 20 ms (checked
per cancel against the decode step it waited for); survivors' steady tok/s within 10% of running
alone.
Figures are printed and written, with every sample, to
``bench/results/cancellation-<timestamp>.json``; the server is always stopped (SIGTERM, then
SIGKILL), Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (
    RESULTS_DIR,
    ROOT,
    default_server_command,
    machine_facts,
    model_facts,
    percentile,
    process_cpu,
    resolve_model,
    running_server,
)

STEP_TARGET_SLACK_S = 0.020
SLICE_S = 1.0
MERGE_S = 0.04  # state changes closer than this belong to one step end (see locate_steps)
THROUGHPUT_TARGET = 0.9
PHASE_DEADLINE_S = 900.0


def prompt_text(index: int) -> str:
    return f"Job {index}: tell me a long story about the number {index} and a lighthouse."


def job_body(index: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "input": prompt_text(index),
        "temperature": 0,
        "max_output_tokens": max_tokens,
        "background": True,
    }


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``GET /health`` answer; ``t`` is when it arrived (``time.perf_counter``)."""

    t: float
    active: int
    queued: int
    prefilling: int
    decoding: int
    tokens: int
    cancelled: int
    finished: int
    cpu: float  # the server process's CPU seconds (all threads) when the answer arrived
    idle: float  # the machine's idle CPU seconds (all cores, /proc/stat) at the same moment

    def state(self) -> tuple[int, ...]:
        return (
            self.active,
            self.queued,
            self.prefilling,
            self.decoding,
            self.tokens,
            self.cancelled,
            self.finished,
        )


@dataclass(slots=True)
class CancelSample:
    index: int
    group: str  # when it was planned: during the prefill, or during decoding
    sent: float
    answered: float
    status: str
    http_status: int
    # From the /health samples: the batch step the cancel waited for (see ``locate_steps``).
    kind: str = "?"  # "prefill" (a step with a prefill chunk) or "decode" (decode only)
    step_start: float | None = None
    step_end: float | None = None
    health_seen: float | None = None  # the removal: ``sequences_cancelled`` showed it

    @property
    def terminal_s(self) -> float:
        return self.answered - self.sent

    @property
    def health_s(self) -> float | None:
        return None if self.health_seen is None else self.health_seen - self.sent

    @property
    def after_removal_s(self) -> float | None:
        """From the removal to the answer: the cancel's own cost once the batch let go,
        +- the polling interval."""
        return None if self.health_seen is None else self.answered - self.health_seen

    @property
    def step_s(self) -> float | None:
        """The duration of the batch step the cancel waited for."""
        if self.step_start is None or self.step_end is None:
            return None
        return self.step_end - self.step_start


@dataclass(slots=True)
class Phase:
    name: str
    jobs: list[int]
    max_tokens: int
    start: float = 0.0
    end: float = 0.0
    prefilled_at: float | None = None  # every job's prompt prefilled, all decoding
    samples: list[Sample] = field(default_factory=list)
    cancels: list[CancelSample] = field(default_factory=list)
    final: dict[int, dict[str, Any]] = field(default_factory=dict)
    server_cpu_s: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def prefill_s(self) -> float:
        return (self.prefilled_at or self.end) - self.start

    @property
    def decode_s(self) -> float:
        return self.end - (self.prefilled_at or self.start)

    def survivors(self) -> list[int]:
        cancelled = {c.index for c in self.cancels}
        return [i for i in self.jobs if i not in cancelled]

    def output_tokens(self, indices: Sequence[int]) -> int:
        return sum(int((self.final[i].get("usage") or {}).get("output_tokens", 0)) for i in indices)


CancelPlan = dict[int, tuple[str, float]]
"""job -> ("prefill", seconds after the phase starts) or ("decode", seconds after every job
is prefilled)."""


def machine_idle() -> float:
    """Idle + iowait CPU seconds of the whole machine since boot (Linux; NaN elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return math.nan
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


async def poll_health(
    client: httpx.AsyncClient,
    base_url: str,
    phase: Phase,
    interval: float,
    all_created: trio.Event,
    prefilled: trio.Event,
    base_ended: int,
    server_pid: int,
) -> None:
    while True:
        batch = (await client.get(base_url + "/health")).json()["batch"]
        sample = Sample(
            time.perf_counter(),
            int(batch["active"]),
            int(batch["queued"]),
            int(batch["prefilling"]),
            int(batch["decoding"]),
            int(batch["tokens_generated"]),
            int(batch["sequences_cancelled"]),
            int(batch["sequences_finished"]),
            process_cpu(server_pid),
            machine_idle(),
        )
        phase.samples.append(sample)
        accounted = sample.finished + sample.cancelled - base_ended + sample.active
        if (
            not prefilled.is_set()
            and all_created.is_set()
            and accounted == len(phase.jobs)
            and sample.queued == sample.prefilling == 0
            and sample.decoding == sample.active
        ):
            phase.prefilled_at = sample.t
            prefilled.set()
        await trio.sleep(interval)


async def run_phase(
    base_url: str,
    name: str,
    jobs: list[int],
    max_tokens: int,
    plan: CancelPlan,
    poll_interval: float,
    server_pid: int,
    stagger: bool = False,
) -> Phase:
    """Run ``jobs`` as background jobs, cancel per ``plan``, until every one has ended.

    With ``stagger`` the k-th job gets ``max_tokens + k`` tokens, so the batch shrinks one
    sequence per step: a warm-up that meets every batch size once."""
    phase = Phase(name, jobs, max_tokens)
    extra = {index: (k if stagger else 0) for k, index in enumerate(jobs)}
    ids: dict[int, str] = {}
    created = {i: trio.Event() for i in jobs}
    all_created, prefilled = trio.Event(), trio.Event()
    limits = httpx.Limits(max_connections=2 * len(jobs) + 8, max_keepalive_connections=len(jobs))
    timeout = httpx.Timeout(120.0, connect=10.0)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as client,
        httpx.AsyncClient(timeout=timeout) as poller,
    ):
        # Open the connections first, so the timed window measures requests, not TCP set-up.
        async with trio.open_nursery() as nursery:
            for _ in range(len(jobs) + len(plan)):
                nursery.start_soon(client.get, base_url + "/health")
        idle = (await poller.get(base_url + "/health")).json()["batch"]
        if idle["active"]:
            raise RuntimeError(f"the batch is not idle before {name}: {idle}")
        base_ended = idle["sequences_finished"] + idle["sequences_cancelled"]

        async def create(index: int) -> None:
            body = job_body(index, max_tokens + extra[index])
            reply = await client.post(base_url + "/v1/responses", json=body)
            if reply.status_code != 200:
                raise RuntimeError(f"create {index}: HTTP {reply.status_code}: {reply.text}")
            ids[index] = reply.json()["id"]
            created[index].set()

        async def create_all() -> None:
            async with trio.open_nursery() as nursery:
                for index in jobs:
                    nursery.start_soon(create, index)
            all_created.set()

        async def cancel(index: int, group: str, delay: float) -> None:
            if group == "decode":
                await prefilled.wait()
            origin = phase.start if group == "prefill" else (phase.prefilled_at or phase.start)
            await trio.sleep(max(0.0, origin + delay - time.perf_counter()))
            await created[index].wait()
            sent = time.perf_counter()
            reply = await client.post(f"{base_url}/v1/responses/{ids[index]}/cancel")
            answered = time.perf_counter()
            status = reply.json().get("status", "?") if reply.status_code == 200 else "?"
            phase.cancels.append(
                CancelSample(index, group, sent, answered, status, reply.status_code)
            )

        cpu_before = process_cpu(server_pid)
        with trio.fail_after(PHASE_DEADLINE_S):
            async with trio.open_nursery() as outer:
                phase.start = time.perf_counter()
                outer.start_soon(
                    poll_health,
                    poller,
                    base_url,
                    phase,
                    poll_interval,
                    all_created,
                    prefilled,
                    base_ended,
                    server_pid,
                )
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(create_all)
                    for index, (group, delay) in plan.items():
                        nursery.start_soon(cancel, index, group, delay)
                # Every job is created and every cancel answered; wait until all our sequences
                # have ended (the counters lag the admissions by a step) and the batch is idle.
                while not phase.samples or (  # noqa: ASYNC110
                    phase.samples[-1].active
                    or phase.samples[-1].finished + phase.samples[-1].cancelled
                    < base_ended + len(jobs)
                ):
                    await trio.sleep(poll_interval)
                phase.end = phase.samples[-1].t
                outer.cancel_scope.cancel()
        phase.server_cpu_s = process_cpu(server_pid) - cpu_before
        for index in jobs:
            phase.final[index] = (await client.get(f"{base_url}/v1/responses/{ids[index]}")).json()
    locate_steps(phase, idle["sequences_cancelled"], max(MERGE_S, 3 * poll_interval))
    return phase


def locate_steps(phase: Phase, base_cancelled: int, merge_s: float) -> None:
    """For each cancel, from the /health samples: when ``sequences_cancelled`` showed it (the
    k-th cancel sent is matched with the counter first reaching base + k) and the batch step it
    waited for: the last step that ended at or before that sample, which began where the step
    before it ended. A cancel that reaches the thread just after a step began waits for all of
    it.

    Step ends are where the published state changes. Between two steps the thread publishes
    twice (after the step, then after applying commands: removals, admissions), so changes
    closer than ``merge_s`` count as one step end, at the first of them.
    """
    samples = phase.samples
    boundaries: list[int] = []
    for i in range(1, len(samples)):
        if samples[i].state() != samples[i - 1].state() and (
            not boundaries or samples[i].t - samples[boundaries[-1]].t > merge_s
        ):
            boundaries.append(i)
    ordered = sorted(phase.cancels, key=lambda c: c.sent)
    for k, cancel in enumerate(ordered, start=1):
        r = next(
            (
                i
                for i, s in enumerate(samples)
                if s.cancelled - base_cancelled >= k and s.t >= cancel.sent
            ),
            None,
        )
        if r is None:
            continue
        cancel.health_seen = samples[r].t
        ends = [b for b in boundaries if b <= r]
        if len(ends) < 2:
            continue
        end, start = ends[-1], ends[-2]
        cancel.step_start, cancel.step_end = samples[start].t, samples[end].t
        waited = samples[end - 1]
        cancel.kind = "prefill" if waited.queued or waited.prefilling else "decode"


@dataclass(frozen=True, slots=True)
class Steady:
    """The batch while it holds exactly the survivors, all decoding."""

    median_tok_s: float | None = None  # median over slices of SLICE_S s (shrugs off bursts)
    mean_tok_s: float | None = None
    cpu_ms_per_token: float | None = None  # server CPU / tokens: barely moved by outside load
    server_cores: float | None = None  # server CPU seconds per second
    idle_cores: float | None = None  # the machine's idle CPU seconds per second
    seconds: float = 0.0


def steady_rate(samples: Sequence[Sample], sequences: int, after: float) -> Steady:
    """The batch from ``after`` on, while it holds exactly ``sequences``, all decoding."""
    window = [
        s for s in samples if s.t >= after and s.active == sequences and s.decoding == sequences
    ]
    if len(window) < 2 or window[-1].t - window[0].t <= 0:
        return Steady()
    span = window[-1].t - window[0].t
    tokens = window[-1].tokens - window[0].tokens
    mean = tokens / span
    cpu = (window[-1].cpu - window[0].cpu) / tokens * 1e3 if tokens else None
    rates: list[float] = []
    first = window[0]
    for sample in window[1:]:
        if sample.t - first.t >= SLICE_S:
            rates.append((sample.tokens - first.tokens) / (sample.t - first.t))
            first = sample
    server = (window[-1].cpu - window[0].cpu) / span
    idle = (window[-1].idle - window[0].idle) / span
    return Steady(statistics.median(rates) if rates else mean, mean, cpu, server, idle, span)


def latency_figures(cancels: Sequence[CancelSample]) -> dict[str, Any]:
    """p50/p99 of cancel -> terminal for these cancels, against the steps they landed in."""
    terminal = [c.terminal_s for c in cancels]
    health = [c.health_s for c in cancels if c.health_s is not None]
    steps = [c.step_s for c in cancels if c.step_s is not None]
    excess = [c.terminal_s - c.step_s for c in cancels if c.step_s is not None]
    after = [c.after_removal_s for c in cancels if c.after_removal_s is not None]
    step_median = statistics.median(steps) if steps else math.nan
    p99 = percentile(terminal, 99)
    return {
        "count": len(cancels),
        "terminal_ms": {
            "p50": percentile(terminal, 50) * 1e3,
            "p99": p99 * 1e3,
            "max": max(terminal, default=math.nan) * 1e3,
        },
        "health_ms": {
            "p50": percentile(health, 50) * 1e3,
            "p99": percentile(health, 99) * 1e3,
        },
        "step_waited_ms": {
            "median": step_median * 1e3,
            "min": min(steps, default=math.nan) * 1e3,
            "max": max(steps, default=math.nan) * 1e3,
        },
        # terminal - the step it waited for (<= 20 ms: within that step + 20 ms).
        "excess_over_step_ms": {
            "p50": percentile(excess, 50) * 1e3,
            "p99": percentile(excess, 99) * 1e3,
        },
        # answer - the removal: the cancel's own cost once the batch let go.
        "after_removal_ms": {
            "p50": percentile(after, 50) * 1e3,
            "p99": percentile(after, 99) * 1e3,
        },
        "within_own_step_plus_20ms": sum(1 for x in excess if x <= STEP_TARGET_SLACK_S),
        "p99_within_own_step_plus_20ms": percentile(excess, 99) <= STEP_TARGET_SLACK_S,
        "p99_within_median_step_plus_20ms": p99 <= step_median + STEP_TARGET_SLACK_S,
    }


@dataclass(slots=True)
class Repeat:
    alone: Phase
    mixed: Phase

    def figures(self) -> dict[str, Any]:
        survivors = self.mixed.survivors()
        cancels = self.mixed.cancels
        last_removal = max((c.health_seen or c.answered for c in cancels), default=self.mixed.start)
        mixed = steady_rate(self.mixed.samples, len(survivors), last_removal)
        alone = steady_rate(self.alone.samples, len(survivors), self.alone.start)
        mixed_tokens = self.mixed.output_tokens(survivors)
        alone_tokens = self.alone.output_tokens(self.alone.jobs)
        mixed_overall = mixed_tokens / self.mixed.duration
        alone_overall = alone_tokens / self.alone.duration
        statuses = [c.status for c in cancels]
        return {
            "jobs": len(self.mixed.jobs),
            "cancelled": len(cancels),
            "cancel_statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
            "cancel_http": sorted({c.http_status for c in cancels}),
            "prefill_s": {"mixed": self.mixed.prefill_s, "alone": self.alone.prefill_s},
            "last_cancel_s": max((c.sent for c in cancels), default=self.mixed.start)
            - self.mixed.start,
            "decode": latency_figures([c for c in cancels if c.kind == "decode"]),
            "prefill": latency_figures([c for c in cancels if c.kind == "prefill"]),
            "unclassified": sum(1 for c in cancels if c.kind == "?"),
            "survivors": len(survivors),
            "survivor_tokens": {"mixed": mixed_tokens, "alone": alone_tokens},
            "expected_tokens": len(survivors) * self.mixed.max_tokens,
            "cancelled_job_tokens": self.mixed.output_tokens([c.index for c in cancels]),
            "steady_tok_s": {"mixed": mixed.median_tok_s, "alone": alone.median_tok_s},
            "steady_window_s": {"mixed": round(mixed.seconds, 2), "alone": round(alone.seconds, 2)},
            "steady_ratio": ratio(mixed.median_tok_s, alone.median_tok_s),
            "steady_mean_tok_s": {"mixed": mixed.mean_tok_s, "alone": alone.mean_tok_s},
            "steady_mean_ratio": ratio(mixed.mean_tok_s, alone.mean_tok_s),
            "steady_cpu_ms_per_token": {
                "mixed": mixed.cpu_ms_per_token,
                "alone": alone.cpu_ms_per_token,
            },
            # alone / mixed CPU per token: the survivors' throughput with the CPU held fixed.
            "steady_cpu_ratio": ratio(alone.cpu_ms_per_token, mixed.cpu_ms_per_token),
            # Cores the server used, and cores the machine left idle, during the windows.
            "steady_server_cores": {"mixed": mixed.server_cores, "alone": alone.server_cores},
            "steady_idle_cores": {"mixed": mixed.idle_cores, "alone": alone.idle_cores},
            "overall_tok_s": {"mixed": mixed_overall, "alone": alone_overall},
            "overall_ratio": mixed_overall / alone_overall,
            "phase_s": {"mixed": self.mixed.duration, "alone": self.alone.duration},
            "server_cpu_s": {"mixed": self.mixed.server_cpu_s, "alone": self.alone.server_cpu_s},
        }


def phase_json(phase: Phase) -> dict[str, Any]:
    start = phase.start

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - start, 4)

    return {
        "name": phase.name,
        "jobs": phase.jobs,
        "duration_s": phase.duration,
        "prefilled_s": rel(phase.prefilled_at),
        "cancels": [
            {
                "index": c.index,
                "group": c.group,
                "kind": c.kind,
                "status": c.status,
                "http_status": c.http_status,
                "sent_s": rel(c.sent),
                "terminal_ms": round(c.terminal_s * 1e3, 2),
                "health_ms": None if c.health_s is None else round(c.health_s * 1e3, 2),
                "step_waited_ms": None if c.step_s is None else round(c.step_s * 1e3, 2),
                "after_removal_ms": None
                if c.after_removal_s is None
                else round(c.after_removal_s * 1e3, 2),
                "step_start_s": rel(c.step_start),
                "step_end_s": rel(c.step_end),
            }
            for c in sorted(phase.cancels, key=lambda c: c.sent)
        ],
        "statuses": {str(i): phase.final[i].get("status") for i in phase.jobs},
        # [t, active, queued, prefilling, decoding, tokens_generated, cancelled, finished,
        #  server CPU s, machine idle CPU s]
        "samples": [
            [round(s.t - start, 4), *s.state(), round(s.cpu, 3), round(s.idle, 3)]
            for s in phase.samples
        ],
    }


def describe_latency(name: str, data: dict[str, Any]) -> str:
    if not data["count"]:
        return f"  {name}: no cancel landed there"
    t, h, step, excess, after = (
        data["terminal_ms"],
        data["health_ms"],
        data["step_waited_ms"],
        data["excess_over_step_ms"],
        data["after_removal_ms"],
    )
    return (
        f"  {name} ({data['count']} cancels): cancel -> terminal p50 {t['p50']:.1f} ms, "
        f"p99 {t['p99']:.1f} ms (max {t['max']:.1f}); cancel -> /health p50 {h['p50']:.1f} ms, "
        f"p99 {h['p99']:.1f} ms\n"
        f"    step waited for: median {step['median']:.1f} ms ({step['min']:.1f}-{step['max']:.1f})"
        f"; terminal - that step: p50 {excess['p50']:.1f} ms, p99 {excess['p99']:.1f} ms\n"
        f"    answer after the removal: p50 {after['p50']:.1f} ms, p99 {after['p99']:.1f} ms;"
        f" within their step + 20 ms: {data['within_own_step_plus_20ms']}/{data['count']}"
    )


def print_repeat(number: int, figures: dict[str, Any]) -> None:
    steady, overall = figures["steady_tok_s"], figures["overall_tok_s"]
    ratio = figures["steady_ratio"]
    prefill = figures["prefill_s"]
    print(
        f"repeat {number}: {figures['jobs']} jobs, {figures['cancelled']} cancelled "
        f"(answers {figures['cancel_statuses']}), the last {figures['last_cancel_s']:.1f} s in; "
        f"prefill took {prefill['mixed']:.1f} s (alone {prefill['alone']:.1f} s)",
        flush=True,
    )
    print(describe_latency("during decode steps", figures["decode"]))
    print(describe_latency("during prefill chunks", figures["prefill"]))
    mean = figures["steady_mean_tok_s"]
    cpu = figures["steady_cpu_ms_per_token"]
    cores, idle = figures["steady_server_cores"], figures["steady_idle_cores"]
    print(
        f"  survivors steady CPU ms/token: mixed {fmt(cpu['mixed'], 2)}, alone "
        f"{fmt(cpu['alone'], 2)}, alone/mixed {fmt(figures['steady_cpu_ratio'], 3)}; server "
        f"used {fmt(cores['mixed'], 2)} / {fmt(cores['alone'], 2)} cores, the machine left "
        f"{fmt(idle['mixed'], 2)} / {fmt(idle['alone'], 2)} idle (mixed / alone)"
    )
    print(
        f"  survivors steady tok/s (median of {SLICE_S:.0f} s slices; mean): "
        f"mixed {fmt(steady['mixed'])}; {fmt(mean['mixed'])} "
        f"({figures['steady_window_s']['mixed']} s), alone {fmt(steady['alone'])}; "
        f"{fmt(mean['alone'])} ({figures['steady_window_s']['alone']} s), ratio "
        + ("n/a" if ratio is None else f"{ratio:.3f}")
        + ("" if figures["steady_mean_ratio"] is None else f"; {figures['steady_mean_ratio']:.3f}")
        + f"\n  survivors overall tok/s: mixed {overall['mixed']:.1f}, alone "
        f"{overall['alone']:.1f}, ratio {figures['overall_ratio']:.3f}  "
        f"(survivor tokens {figures['survivor_tokens']}, expected "
        f"{figures['expected_tokens']}; cancelled jobs made {figures['cancelled_job_tokens']})",
        flush=True,
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def plan_cancels(
    rng: random.Random,
    cancelled: list[int],
    prefill_cancels: int,
    prefill_window: float,
    decode_window: float,
) -> CancelPlan:
    plan: CancelPlan = {}
    for n, index in enumerate(cancelled):
        if n < prefill_cancels:
            plan[index] = ("prefill", rng.uniform(0.0, prefill_window))
        else:
            plan[index] = ("decode", rng.uniform(0.0, decode_window))
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--jobs", type=int, default=32, help="concurrent background jobs")
    parser.add_argument("--max-tokens", type=int, default=160, help="max_output_tokens per job")
    parser.add_argument(
        "--prefill-cancels",
        type=int,
        default=4,
        help="of the cancelled half, how many land at random moments of the prefill",
    )
    parser.add_argument(
        "--cancel-window",
        type=float,
        default=0.5,
        help="the other cancels land uniformly over this fraction of the alone phase's decode "
        "time, counted from the moment every job is prefilled",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--poll-interval", type=float, default=0.01, help="/health polling, s")
    parser.add_argument("--server-command", default=None, help="as for bench/throughput.py")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    command = shlex.split(args.server_command) if args.server_command else default_server_command()
    rng = random.Random(args.seed)

    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model(args.model)
    facts = machine_facts()
    print(f"model: {model_path}")
    print(f"machine: {facts['cpu']} x{facts['cpu_count']}, load {facts['load_average_at_start']}")
    log_path = RESULTS_DIR / f"server-cancellation-{stamp}.log"
    repeats: list[Repeat] = []
    with running_server(command, model_path, log_path) as server:
        pid = server.process.pid
        print(f"server: {server.base_url} (log {log_path.relative_to(ROOT)})", flush=True)
        # Warm-up: every batch size from ``--jobs`` down to 1 (kernels compiled on first use).
        trio.run(
            run_phase, server.base_url, "warm-up", list(range(args.jobs)), 2, {}, 0.05, pid, True
        )
        windows: tuple[float, float] | None = None
        for number in range(1, args.repeats + 1):
            jobs = list(range(number * 1000, number * 1000 + args.jobs))
            cancelled = rng.sample(jobs, args.jobs // 2)
            survivors = [i for i in jobs if i not in cancelled]
            phases: dict[str, Phase] = {}
            # The first repeat runs alone first (its timings set the cancel windows); later
            # repeats alternate the order.
            for name in ("alone", "mixed") if number % 2 == 1 else ("mixed", "alone"):
                if name == "alone":
                    phase = trio.run(
                        run_phase,
                        server.base_url,
                        "alone",
                        survivors,
                        args.max_tokens,
                        {},
                        args.poll_interval,
                        pid,
                    )
                    if windows is None:
                        # All jobs take about jobs/survivors times the survivors' prefill.
                        scale = len(jobs) / max(1, len(survivors))
                        windows = (phase.prefill_s * scale, args.cancel_window * phase.decode_s)
                else:
                    assert windows is not None
                    plan = plan_cancels(rng, cancelled, args.prefill_cancels, *windows)
                    phase = trio.run(
                        run_phase,
                        server.base_url,
                        "mixed",
                        jobs,
                        args.max_tokens,
                        plan,
                        args.poll_interval,
                        pid,
                    )
                phases[name] = phase
            repeat = Repeat(phases["alone"], phases["mixed"])
            repeats.append(repeat)
            print_repeat(number, repeat.figures())

    figures = [r.figures() for r in repeats]
    every = [c for r in repeats for c in r.mixed.cancels]
    decode = latency_figures([c for c in every if c.kind == "decode"])
    prefill = latency_figures([c for c in every if c.kind == "prefill"])
    ratios = [f["steady_ratio"] for f in figures if f["steady_ratio"] is not None]
    steady = statistics.median(ratios) if ratios else None
    cpu_ratios = [f["steady_cpu_ratio"] for f in figures if f["steady_cpu_ratio"] is not None]
    cpu_steady = statistics.median(cpu_ratios) if cpu_ratios else None
    summary = {
        "decode": decode,
        "prefill": prefill,
        "latency_target_holds": decode["count"] > 0 and decode["p99_within_own_step_plus_20ms"],
        "steady_ratio_median": steady,
        "throughput_target_holds": steady is not None and steady >= THROUGHPUT_TARGET,
        "steady_cpu_ratio_median": cpu_steady,
        "cpu_target_holds": cpu_steady is not None and cpu_steady >= THROUGHPUT_TARGET,
        "overall_ratio_median": statistics.median(f["overall_ratio"] for f in figures),
    }
    results_file = RESULTS_DIR / f"cancellation-{stamp}.json"
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": facts,
        "model": model_facts(model_path),
        "args": vars(args),
        "summary": summary,
        "repeats": [
            {"figures": f, "alone": phase_json(r.alone), "mixed": phase_json(r.mixed)}
            for f, r in zip(figures, repeats, strict=True)
        ],
        "server": {"exit_code": server.exit_code, "killed": server.killed},
    }
    results_file.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(f"all repeats ({len(every)} cancels):")
    print(describe_latency("during decode steps", decode))
    print(describe_latency("during prefill chunks", prefill))
    target_ms = decode["step_waited_ms"]["median"] + STEP_TARGET_SLACK_S * 1e3
    verdict = "HOLDS" if summary["latency_target_holds"] else "DOES NOT HOLD"
    print(
        f"target p99 cancel -> terminal (decode) <= the decode step it landed in + 20 ms: "
        f"{verdict} (p99 of terminal - step: {decode['excess_over_step_ms']['p99']:.1f} ms)"
    )
    literal = "holds" if decode["p99_within_median_step_plus_20ms"] else "does not hold"
    print(
        f"  (against the median decode step + 20 ms = {target_ms:.1f} ms instead: {literal}, "
        f"p99 {decode['terminal_ms']['p99']:.1f} ms)"
    )
    verdict = "HOLDS" if summary["throughput_target_holds"] else "DOES NOT HOLD"
    print(
        "target survivors' steady tok/s >= 0.9 x alone: "
        + ("n/a" if steady is None else f"{steady:.3f}")
        + f": {verdict}; overall survivors' tok/s ratio {summary['overall_ratio_median']:.3f}"
    )
    verdict = "HOLDS" if summary["cpu_target_holds"] else "DOES NOT HOLD"
    print(
        "  the same with the CPU held fixed (alone / mixed CPU per token): "
        + ("n/a" if cpu_steady is None else f"{cpu_steady:.3f}")
        + f": {verdict}"
    )
    print(f"server exit code on SIGTERM: {server.exit_code}")
    print(f"results: {results_file.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
