"""Prefill chunk sizes on this machine's MLX device: a long prompt's time to first token and the
longest single chunk (what a cancel during prefill waits for), at several ``prefill_step_size``
values, with ``BatchGenerator`` driven directly.

Run::

    .venv/bin/python bench/prefill_steps.py [--model PATH] [--steps 512,1024,2048]
        [--prompt-tokens 2000] [--repeats 5]

Each repeat runs every step size once, in an order that rotates per repeat, on a fresh
generator: one prompt of ``--prompt-tokens`` tokens, ``max_tokens=1``; the time to first token
is from ``insert`` to the first generated token, a chunk's time the wall time of one ``next()``
that prefilled. Medians are reported, with each size's ratio to the first size measured in the
same run (the machine is shared). This is what ``engine/sizing.py``'s device defaults rest on
(docs/operations.md, "Batch sizes").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx_responses  # noqa: F401 - preloads OpenBLAS before MLX
from mlx_responses.blas import openblas_loaded

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_bench_model import make_bench_model


def one_run(model: Any, step: int, prompt: list[int]) -> tuple[float, float]:
    """(time to first token, longest prefill chunk) in seconds."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(
        model,
        completion_batch_size=32,
        prefill_batch_size=8,
        prefill_step_size=step,
        stream=mx.new_stream(mx.default_device()),
    )
    try:
        began = time.perf_counter()
        generator.insert([prompt], max_tokens=[1])
        longest = 0.0
        while True:
            chunk = time.perf_counter()
            prompt_responses, generated = generator.next()
            spent = time.perf_counter() - chunk
            if prompt_responses and not generated:
                longest = max(longest, spent)
            if generated:
                return time.perf_counter() - began, longest
    finally:
        generator.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the bench model, made if missing)")
    parser.add_argument("--steps", default="512,1024,2048")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import mlx.core as mx
    from mlx_lm import load

    path = args.model or str(make_bench_model())
    model, _ = load(path)[:2]
    steps = [int(s) for s in args.steps.split(",")]
    # Ids inside the vocabulary (an id past it reads outside the embedding table).
    vocab = int(json.loads((Path(path) / "config.json").read_text())["vocab_size"])
    prompt = [(i * 7919) % (vocab - 10) + 10 for i in range(args.prompt_tokens)]
    one_run(model, steps[0], prompt[:64])  # warm up (kernels, allocator)
    ttft: dict[int, list[float]] = {s: [] for s in steps}
    chunk: dict[int, list[float]] = {s: [] for s in steps}
    for repeat in range(args.repeats):
        turn = repeat % len(steps)
        for step in steps[turn:] + steps[:turn]:
            first, longest = one_run(model, step, prompt)
            ttft[step].append(first)
            chunk[step].append(longest)
    base = steps[0]
    print(
        f"device {mx.default_device()}, OpenBLAS {'loaded' if openblas_loaded() else 'not loaded'}"
        f", model {path}, prompt {args.prompt_tokens} tokens, {args.repeats} repeats"
    )
    result: dict[str, Any] = {"device": str(mx.default_device()), "openblas": openblas_loaded()}
    for step in steps:
        first = statistics.median(ttft[step])
        longest = statistics.median(chunk[step])
        ratio = first / statistics.median(ttft[base])
        print(
            f"prefill step {step:5d}: time to first token {first * 1000:8.1f} ms "
            f"({ratio:.2f}x step {base}'s), longest chunk {longest * 1000:7.1f} ms"
        )
        result[str(step)] = {"ttft_s": first, "longest_chunk_s": longest, "ttft_ratio": ratio}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
