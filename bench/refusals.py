"""What a refusal costs: CPU seconds and peak resident memory to refuse unfittable bodies.

Run::

    .venv/bin/python bench/refusals.py [--sizes 1 8 32] [--full-sizes 1]

Each case runs in a fresh child process (so one case's heap cannot flatter the next), which
starts the real server in-process (``serve``: Hypercorn, the actors, the bundled model, whose
context window is 2048 tokens; ``--max-request-bytes`` raised to 64 MiB so a 32 MiB body is
read), warms it with one normal request, then sends one request and measures, around that
request only:

- **CPU seconds**: ``time.process_time()`` of the whole process (server threads included; the
  client's share is small: the body is built before the clock starts);
- **peak RSS growth**: the highest ``VmRSS`` a sampling thread saw during the request (every
  2 ms) minus ``VmRSS`` just before it.

Cases: ``accept``, a normal request (``"hi"``, 8 output tokens), the baseline; ``refuse N``, a
valid body whose ``instructions`` are N MiB of one long word (the input that made the tokenizer
explode), refused 400 ``context_length_exceeded`` by the byte bound of
``model/prompt_bounds.py``; ``full N``, the same body refused the old way, after tokenizing it
in full (``prompt_limit`` disabled for that child), the figure the bound replaces. Ratios are
against ``accept`` measured in the same run. Results also go to
``bench/results/refusals-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.actors.model import ModelSettings
from mlx_responses.engine.bundled_model import BUNDLED_ALIAS, BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, ServerSettings, serve

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
MIB = 1 << 20


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Sampler:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.start = self.peak = resident_bytes()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, resident_bytes())

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, resident_bytes())


def settings() -> ServerSettings:
    model = ModelSettings(model_path=str(BUNDLED_MODEL_PATH), alias=BUNDLED_ALIAS)
    return ServerSettings(
        host="127.0.0.1", port=0, model=model, graceful_timeout=5, max_request_bytes=64 * MIB
    )


def body_for(kind: str, mib: int) -> bytes:
    if kind == "accept":
        return json.dumps({"model": BUNDLED_ALIAS, "input": "hi", "max_output_tokens": 8}).encode()
    return json.dumps(
        {"model": BUNDLED_ALIAS, "instructions": "x" * (mib * MIB), "input": "hi"}
    ).encode()


async def measure(kind: str, mib: int) -> dict[str, Any]:
    if kind == "full":
        import mlx_responses.actors.prompt as prompt

        prompt.prompt_limit = lambda request, model: None  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        server: ServerHandle = await nursery.start(serve, settings())
        async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as http:
            warm = await http.post("/v1/responses", content=body_for("accept", 0))
            assert warm.status_code == 200, warm.text
            body = body_for(kind, mib)
            headers = {"content-type": "application/json"}
            cpu = time.process_time()
            wall = time.perf_counter()
            with Sampler() as sampler:
                reply = await http.post("/v1/responses", content=body, headers=headers)
            cpu = time.process_time() - cpu
            wall = time.perf_counter() - wall
        server.shutdown()
    code = reply.json().get("error", {}).get("code") if reply.status_code != 200 else None
    return {
        "case": kind if kind == "accept" else f"{kind} {mib} MiB",
        "body_bytes": len(body),
        "status": reply.status_code,
        "code": code,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "rss_growth_mib": round((sampler.peak - sampler.start) / MIB, 1),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def child(kind: str, mib: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(mib)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 8, 32])
    parser.add_argument("--full-sizes", type=int, nargs="*", default=[1])
    parser.add_argument("--child", nargs=2, metavar=("KIND", "MIB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, mib = args.child[0], int(args.child[1])
        print(json.dumps(trio.run(measure, kind, mib)))
        return
    cases = [("accept", 0)] + [("refuse", m) for m in args.sizes]
    cases += [("full", m) for m in args.full_sizes]
    results = [child(kind, mib) for kind, mib in cases]
    base = results[0]
    print(
        f"{'case':<16}{'body MiB':>10}{'status':>8}{'CPU s':>9}{'x accept':>10}"
        f"{'RSS +MiB':>10}{'x body':>8}{'peak MiB':>10}"
    )
    for r in results:
        ratio = r["cpu_s"] / base["cpu_s"] if base["cpu_s"] else float("nan")
        per_body = r["rss_growth_mib"] * MIB / r["body_bytes"]
        print(
            f"{r['case']:<16}{r['body_bytes'] / MIB:>10.1f}{r['status']:>8}{r['cpu_s']:>9.2f}"
            f"{ratio:>10.1f}{r['rss_growth_mib']:>10.1f}{per_body:>8.1f}{r['max_rss_mib']:>10.0f}"
        )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS_DIR / f"refusals-{stamp}.json").write_text(
        json.dumps([dataclasses.asdict(settings().model), *results], indent=2, default=str)
    )


if __name__ == "__main__":
    main()
