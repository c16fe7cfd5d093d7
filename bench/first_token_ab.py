"""A lone request's first token: the server against mlx-lm driven directly, round by round.

Run::

    .venv/bin/python bench/first_token_ab.py [--model PATH] [--rounds 60] [--warm 5]
        [--max-tokens 16] [--base-command CMD] [--server-arg ARG ...] [--unique]
        [--prompt-cache]

``bench/throughput.py`` reads the first token of a lone stream from 20 requests a side (one
stream, four turns, five repeats), over minutes of other work. This reads only that figure,
from many requests, with each side's requests next to each other's. Each round, in an order
that rotates, after a pause of ``PAUSE_SECONDS``:

- **direct**: ``throughput.DirectRunner`` on this process's main thread, one prompt inserted
  into a fresh ``BatchGenerator``, timed from its insertion to its first token (its rendering
  is not timed);
- **ours**: ``mlx-responses serve``, one streamed request, timed from its send by the client
  (``throughput.stream_one``) to its first text delta;
- **base** (with ``--base-command``): a second server started with that command line (an
  older commit's ``src/`` on ``PYTHONPATH``, or an environment variable set), read the same
  way.

Both servers run with their prompt caches off unless ``--prompt-cache`` (every round asks
the same prompt, which direct prefills each time); ``--unique`` makes every round's prompt
its own (a line in front of it), so a prompt cache that is on finds only the template's
first tokens. The first ``--warm`` rounds are not counted. Printed: each side's p50 and p90,
and per pair of sides the median of the rounds' differences and the rounds the first was
faster in. Samples go to ``bench/results/first-token-ab-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import throughput

PAUSE_SECONDS = 0.05


def compare(first: Sequence[float], second: Sequence[float]) -> dict[str, Any]:
    """``first`` against ``second``, round by round (ms): the median of the differences
    (first - second), the rounds where ``first`` was faster, and how many rounds."""
    differences = [a - b for a, b in zip(first, second, strict=True)]
    return {
        "paired_ms": round(statistics.median(differences), 3),
        "faster": sum(d < 0 for d in differences),
        "rounds": len(differences),
    }


def summary(samples: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Each side's p50 and p90 (ms), and ``ours`` against every other side, paired."""
    sides = {
        side: {
            "p50_ms": round(statistics.median(values), 3),
            "p90_ms": round(throughput.percentile(values, 90), 3),
        }
        for side, values in samples.items()
    }
    pairs = {
        f"ours-{side}": compare(samples["ours"], samples[side])
        for side in samples
        if side != "ours"
    }
    return {"sides": sides, "pairs": pairs}


def round_text(model_prompt: str, round_index: int, unique: bool) -> str:
    return f"Note {round_index}.\n{model_prompt}" if unique else model_prompt


async def measure(
    direct: throughput.DirectRunner,
    urls: Mapping[str, str],
    texts: Sequence[str],
    max_tokens: int,
) -> list[dict[str, tuple[float, str]]]:
    """Every round's first token (seconds) and text, per side; the order rotates each round.
    One client, kept alive between rounds, reads every server."""
    sides = ["direct", *urls]
    rounds: list[dict[str, tuple[float, str]]] = []
    async with throughput.new_client(len(urls)) as client:
        for index, text in enumerate(texts):
            got: dict[str, tuple[float, str]] = {}
            shift = index % len(sides)
            for side in sides[shift:] + sides[:shift]:
                await trio.sleep(PAUSE_SECONDS)
                if side == "direct":  # blocks the loop: nothing else runs here meanwhile
                    measured = direct.run(1, max_tokens, texts=(text,))
                    got[side] = (measured.request_first_s[0], measured.outputs[0])
                    continue
                body = {**throughput.request_body(0, max_tokens), "input": text}
                result = await throughput.stream_one(client, urls[side], body)
                if not result.deltas:
                    raise RuntimeError(f"no text delta from {side}: {result.terminal}")
                got[side] = (result.first_delta_at - result.sent_at, result.text)
            rounds.append(got)
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warm", type=int, default=5, help="first rounds not counted")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--base-command", help="a second server's command line (before 'serve')")
    parser.add_argument("--server-arg", action="append", default=[], help="to both servers")
    parser.add_argument("--unique", action="store_true", help="every round its own prompt")
    parser.add_argument("--prompt-cache", action="store_true", help="servers' prompt cache on")
    parser.add_argument("--output", type=Path, default=None, help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.rounds <= args.warm:
        parser.error("--rounds must be more than --warm")
    openblas = throughput.preload_openblas()
    model = throughput.resolve_model(args.model)
    throughput.use_documented_prompt(model)
    prompt = throughput.prompt_text(0)
    extra = [*args.server_arg, *(() if args.prompt_cache else ("--prompt-cache-bytes", "0"))]
    commands = {"ours": throughput.default_server_command()}
    if args.base_command:
        commands["base"] = shlex.split(args.base_command)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    direct = throughput.DirectRunner(model)
    with contextlib.ExitStack() as stack:
        urls = {
            side: stack.enter_context(
                throughput.running_server(
                    command,
                    model,
                    throughput.RESULTS_DIR / f"first-token-ab-{stamp}-{side}.log",
                    extra_args=extra,
                )
            ).base_url
            for side, command in commands.items()
        }
        asked = [round_text(prompt, index, args.unique) for index in range(args.rounds)]
        rounds = trio.run(measure, direct, urls, asked, args.max_tokens)
    counted = rounds[args.warm :]
    samples = {side: [got[side][0] * 1e3 for got in counted] for side in rounds[0]}
    report = {
        "model": model,
        "openblas": openblas,
        "rounds": args.rounds - args.warm,
        "max_tokens": args.max_tokens,
        "unique": args.unique,
        "prompt_cache": args.prompt_cache,
        "commands": {side: " ".join(command) for side, command in commands.items()},
        "server_args": extra,
        # Greedy and the same prompt: every side answers each round with the same text.
        "same_text": all(len({said for _, said in got.values()}) == 1 for got in rounds),
        **summary(samples),
        "samples_ms": {side: [round(v, 3) for v in values] for side, values in samples.items()},
    }
    output = args.output or throughput.RESULTS_DIR / f"first-token-ab-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(
        f"model {model}; OpenBLAS loaded: {openblas}; {report['rounds']} rounds counted; "
        f"--max-tokens {args.max_tokens}; prompt {'unique per round' if args.unique else 'same'};"
        f" prompt cache {'on' if args.prompt_cache else 'off'}; same text: {report['same_text']}"
    )
    for side, figures in report["sides"].items():
        print(f"{side}: first token p50 {figures['p50_ms']:.2f} ms, p90 {figures['p90_ms']:.2f} ms")
    for pair, figures in report["pairs"].items():
        print(
            f"{pair}: {figures['paired_ms']:+.2f} ms paired (median of the rounds), ours faster"
            f" in {figures['faster']} of {figures['rounds']}"
        )
    print(f"samples: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
