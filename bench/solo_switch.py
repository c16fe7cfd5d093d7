"""Lone requests, the server with ``--solo-decode on`` against ``off``, alternating.

Run::

    .venv/bin/python bench/solo_switch.py [--model PATH] [--max-tokens 256] [--rounds 8]
        [--presence-penalty 0.1] [--frequency-penalty 0.1]

Two servers on the same model (their prompt caches off), one request at a time, answered
whole (greedy, the same prompt), the order flipped every round; tokens/s per request, the
median of each side and of the per-round ratios (on / off), and the rounds ``on`` won. With
penalties (the default) every request carries logits processors, which decode alone since the
ninth pass. Prints only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--presence-penalty", type=float, default=0.1)
    parser.add_argument("--frequency-penalty", type=float, default=0.1)
    args = parser.parse_args(argv)
    openblas = throughput.preload_openblas()
    model = throughput.resolve_model(args.model)
    throughput.use_documented_prompt(model)
    body: dict[str, Any] = {
        "model": "bench",
        "input": throughput.prompt_text(0),
        "temperature": 0,
        "max_output_tokens": args.max_tokens,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
    }
    rates: dict[str, list[float]] = {"on": [], "off": []}
    tokens = 0
    with contextlib.ExitStack() as stack:
        servers = {}
        for side in rates:
            os.environ["MLX_RESPONSES_SOLO_DECODE"] = side
            log = throughput.RESULTS_DIR / f"solo-switch-{side}.log"
            servers[side] = stack.enter_context(
                throughput.running_server(
                    throughput.default_server_command(),
                    model,
                    log,
                    extra_args=("--prompt-cache-bytes", "0"),
                )
            )
        client = stack.enter_context(httpx.Client(timeout=300))
        for server in servers.values():  # each side's first request compiles nothing timed
            client.post(server.base_url + "/v1/responses", json=body).raise_for_status()
        for round_index in range(args.rounds):
            for side in ("on", "off") if round_index % 2 == 0 else ("off", "on"):
                time.sleep(throughput.SETTLE_SECONDS / 2)
                began = time.perf_counter()
                response = client.post(servers[side].base_url + "/v1/responses", json=body)
                response.raise_for_status()
                tokens = int(response.json()["usage"]["output_tokens"])
                rates[side].append(tokens / (time.perf_counter() - began))
    ratios = [on / off for on, off in zip(rates["on"], rates["off"], strict=True)]
    print(
        f"model {model}; OpenBLAS loaded: {openblas}; {tokens} tokens a request; penalties "
        f"{args.presence_penalty} / {args.frequency_penalty}; {args.rounds} rounds"
    )
    print(
        f"on {statistics.median(rates['on']):.1f} tok/s, off {statistics.median(rates['off']):.1f}"
        f" tok/s; on / off {statistics.median(ratios):.3f} (per round "
        f"{', '.join(f'{r:.2f}' for r in ratios)}); on won {sum(r > 1 for r in ratios)}"
        f" of {len(ratios)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
