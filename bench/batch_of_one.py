"""What a batch of one costs: mlx-lm's ``BatchGenerator`` decoding one sequence, against the
model called on a plain ``KVCache`` with the same pipelining (the next token computing while
this one is read), as the server decodes a sequence alone (``--solo-decode``,
docs/architecture.md "A sequence alone").

Both sides run in this process on the same model and prompt, greedy, interleaved round by
round; each round prints both sides' time per decoded token, and the end prints the medians,
the median of the per-round ratios and whether the tokens were identical. The prefill is
outside the timed window on both sides. Imports mlx and mlx-lm only.

    .venv/bin/python bench/batch_of_one.py [--model PATH] [--tokens 300] [--rounds 8]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "src" / "engine" / "bundled"
PROMPT = "Count from 1 to 400."


def preload_openblas() -> bool:
    """Map OpenBLAS before mlx, as the server's entry point does (False: not installed)."""
    try:
        ctypes.CDLL("libopenblas.so.0", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def batched(model: Any, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """Seconds per decoded token and the tokens, ``BatchGenerator`` with one sequence."""
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(model, max_tokens=tokens, stop_tokens=set())
    out: list[int] = []
    try:
        generator.insert([prompt], [tokens])
        began = 0.0
        while len(out) < tokens:
            _, responses = generator.next()
            for response in responses:
                out.append(response.token)
                if len(out) == 1:
                    began = time.perf_counter()  # the first token closes the prefill
        return (time.perf_counter() - began) / (tokens - 1), out
    finally:
        generator.close()


def alone(model: Any, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """The same on a plain cache: one model call a step, the next token set computing before
    this one is read (``mx.async_eval``), greedy on the log-probabilities."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)

    def step(inputs: Any) -> Any:
        logits = model(inputs, cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = mx.argmax(logprobs, axis=-1)
        mx.async_eval(sampled, logprobs)
        return sampled

    # The prompt but its last token first, then that token: as the generator splits it.
    model(mx.array([prompt[:-1]]), cache=cache)
    mx.eval([layer.state for layer in cache])
    pending = step(mx.array([prompt[-1:]]))
    out: list[int] = []
    began = 0.0
    while len(out) < tokens:
        current = pending
        pending = step(current[:, None])
        out.append(int(current.item()))
        if len(out) == 1:
            began = time.perf_counter()  # the first token closes the prefill
    return (time.perf_counter() - began) / (tokens - 1), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    openblas = preload_openblas()
    from mlx_lm import load

    model, tokenizer = load(args.model)
    chat = [{"role": "user", "content": PROMPT}]
    prompt = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True))
    sides = {"batch of one": batched, "alone": alone}
    times: dict[str, list[float]] = {name: [] for name in sides}
    texts: dict[str, list[int]] = {}
    for _ in range(2):  # warm both paths' kernels
        for run in sides.values():
            run(model, prompt, 8)
    for index in range(args.rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        line = []
        for name in order:
            seconds, out = sides[name](model, prompt, args.tokens)
            times[name].append(seconds)
            texts[name] = out
            line.append(f"{name} {seconds * 1e6:.0f} us")
        print(f"round {index + 1}: " + ", ".join(line), flush=True)
    ratios = [a / b for a, b in zip(times["alone"], times["batch of one"], strict=True)]
    print(
        f"\n{Path(args.model).name}, {args.tokens} tokens, {args.rounds} rounds, "
        f"OpenBLAS {'loaded' if openblas else 'not loaded'}"
    )
    for name, values in times.items():
        print(f"{name}: {statistics.median(values) * 1e6:.0f} us a token (median)")
    print(f"alone / batch of one, time a token: {statistics.median(ratios):.3f} (median of rounds)")
    same = texts["alone"] == texts["batch of one"]
    print(f"identical tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
