"""What ``--kv-bits`` costs and saves: bytes per token, 16-stream throughput, greedy agreement
and logprob drift, each against full precision measured in the same run.

Run::

    .venv/bin/python bench/kv_quant.py [--bits 8,4] [--streams 16] [--max-tokens 128]
        [--repeats 3] [--prompts 32]

Everything runs in this process on mlx-lm's ``BatchGenerator`` driven as the server drives it
(its batch settings, the server's own quantized caches from ``engine/kv_cache.py``); the HTTP
side does not change with ``--kv-bits`` and is left out.

1. Throughput: on the bench model (``bench/make_bench_model.py``), S greedy streams inserted
   together, full precision and each bit width alternating (the order turns every repeat);
   tokens/s medians and the median of the per-repeat ratios.
2. Bytes per token: the KV bytes the batch holds for a finished sequence (its extracted cache,
   what the prompt cache stores) over the tokens it holds; on the bench model as written
   (float32) and cast to bfloat16, as most served models are.
3. Quality, on the bench model (N prompts) and on the trained fixtures (the bundled model and
   the hosted-tools fixture, their documented prompts; their heads are 32 wide, so group 32):
   greedy agreement of the batch's outputs (the share of tokens before the first divergence,
   position-wise agreement, the share of outputs identical), and the drift of the chosen
   tokens' logprobs with the full-precision outputs teacher-forced: mean and max
   |logprob(quantized) - logprob(full)|. The same drift is measured for the alternative of
   quantizing only at the end of prefill (the prompt attends to itself at full precision).

Results are printed and written to ``bench/results/kv_quant-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import (
    COMPLETION_BATCH_SIZE,
    PREFILL_BATCH_SIZE,
    PREFILL_STEP_SIZE,
    openblas_mapped,
    preload_openblas,
)

OPENBLAS = preload_openblas()  # before anything imports mlx

from make_bench_model import make_bench_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
FIXTURES = {
    "bundled": ROOT / "src" / "engine" / "bundled",
    "hosted_model": ROOT / "tests" / "fixtures" / "hosted_model",
}
# The bar for --kv-bits 8 (bench model, bfloat16 bytes; 16 streams).
TARGET_BYTES = 0.55
TARGET_THROUGHPUT = 0.9


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    model: Any
    tokenizer: Any
    group_size: int


def load(name: str, path: Path, group_size: int) -> Model:
    from mlx_lm import load as mlx_load

    model, tokenizer = mlx_load(str(path))[:2]
    return Model(name, model, tokenizer, group_size)


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    tokens = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    return [int(t) for t in tokens]


def bench_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    topics = ("a lighthouse", "the sea", "a clock", "a garden", "rain", "a train", "bread")
    return [
        render(
            tokenizer,
            [{"role": "user", "content": f"Story {i}: tell me about {topics[i % len(topics)]}."}],
        )
        for i in range(count)
    ]


def documented_prompts(tokenizer: Any, folder: Path) -> list[list[int]]:
    """A fixture's documented prompts: its chat messages rendered, or its recorded ids."""
    records = json.loads((folder / "prompts.json").read_text(encoding="utf-8"))
    return [
        [int(t) for t in r["prompt_ids"]]
        if "prompt_ids" in r
        else render(tokenizer, r["messages"], r.get("tools"))
        for r in records
    ]


def caches(m: Model, bits: int | None, count: int) -> list[Any] | None:
    from mlx_responses.engine.kv_cache import quantize_layers
    from mlx_responses.engine.kv_quant import KvQuant

    if bits is None:
        return None
    return [quantize_layers(None, m.model, KvQuant(bits, m.group_size)) for _ in range(count)]


@dataclass(slots=True)
class Run:
    tokens: list[list[int]]
    seconds: float
    bytes_per_token: float


def generate(m: Model, prompts: list[list[int]], bits: int | None, max_tokens: int) -> Run:
    """Greedy outputs of ``prompts`` inserted together (the stop token left out), the time
    from insert to the last token, and the KV bytes per held token of the finished caches."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator, make_stop_sequences
    from mlx_lm.sample_utils import make_sampler

    generator = BatchGenerator(
        m.model,
        completion_batch_size=COMPLETION_BATCH_SIZE,
        prefill_batch_size=PREFILL_BATCH_SIZE,
        prefill_step_size=PREFILL_STEP_SIZE,
        stream=mx.new_stream(mx.default_device()),
    )
    n = len(prompts)
    try:
        start = time.perf_counter()
        uids = generator.insert(
            prompts,
            max_tokens=[max_tokens] * n,
            caches=caches(m, bits, n),
            samplers=[make_sampler(temp=0.0)] * n,
            stop_sequences=[make_stop_sequences(m.tokenizer)] * n,
        )
        out: dict[int, list[int]] = {uid: [] for uid in uids}
        held = [0, 0]  # bytes, tokens
        running = set(uids)
        while running:
            _, responses = generator.next()
            for r in responses:
                if r.finish_reason != "stop":
                    out[r.uid].append(int(r.token))
                if r.finish_reason is not None:
                    running.discard(r.uid)
                    layers = [c for c in r.prompt_cache if isinstance(c.offset, int)]
                    held[0] += sum(int(c.nbytes) for c in layers)
                    held[1] += int(layers[0].offset)
        seconds = time.perf_counter() - start
    finally:
        generator.close()
    return Run([out[uid] for uid in uids], seconds, held[0] / held[1] if held[1] else 0.0)


# -- quality -----------------------------------------------------------------------------------


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    prefix = positions = same = 0
    total = sum(len(r) for r in reference)
    for ref, got in zip(reference, other, strict=True):
        common = 0
        for a, b in zip(ref, got, strict=False):
            if a != b:
                break
            common += 1
        prefix += common
        positions += sum(a == b for a, b in zip(ref, got, strict=False))
    same = sum(ref == got for ref, got in zip(reference, other, strict=True))
    return {
        "until_first_divergence": prefix / total if total else 1.0,
        "position_wise": positions / total if total else 1.0,
        "identical_outputs": same / len(reference),
    }


def chosen_logprobs(
    m: Model, prompt: list[int], tokens: list[int], bits: int | None, *, at_prefill_end: bool
) -> list[float]:
    """The logprobs of ``tokens`` (teacher-forced after ``prompt``) through a one-row cache:
    full precision, quantized as written (what ``--kv-bits`` does), or with the prompt prefilled
    at full precision and quantized at its end (the alternative)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_responses.engine.kv_cache import quantize_layers
    from mlx_responses.engine.kv_quant import KvQuant

    if not tokens:
        return []
    quant = None if bits is None else KvQuant(bits, m.group_size)
    sequence = [*prompt, *tokens]
    if quant is None or not at_prefill_end:
        layers = (
            make_prompt_cache(m.model) if quant is None else quantize_layers(None, m.model, quant)
        )
        batch = [layer.merge([layer]) for layer in layers]
        logits = m.model(mx.array([sequence[:-1]]), cache=batch)[0, len(prompt) - 1 :]
    else:
        layers = make_prompt_cache(m.model)
        m.model(mx.array([prompt[:-1]]), cache=layers)
        layers = quantize_layers(layers, m.model, quant)
        batch = [layer.merge([layer]) for layer in layers]
        logits = m.model(mx.array([sequence[len(prompt) - 1 : -1]]), cache=batch)[0]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logprobs, mx.array(tokens)[:, None], axis=-1)[:, 0]
    values: list[float] = picked.astype(mx.float32).tolist()  # type: ignore[assignment]
    return values


def drift(
    m: Model, prompts: list[list[int]], reference: list[list[int]], bits: int, at_end: bool
) -> dict[str, float]:
    gaps: list[float] = []
    for prompt, tokens in zip(prompts, reference, strict=True):
        full = chosen_logprobs(m, prompt, tokens, None, at_prefill_end=False)
        quant = chosen_logprobs(m, prompt, tokens, bits, at_prefill_end=at_end)
        gaps.extend(abs(a - b) for a, b in zip(full, quant, strict=True))
    return {
        "mean_abs": statistics.fmean(gaps) if gaps else 0.0,
        "max_abs": max(gaps, default=0.0),
        "tokens": len(gaps),
    }


def quality(
    m: Model, prompts: list[list[int]], bits_list: list[int], max_tokens: int
) -> dict[str, Any]:
    reference = generate(m, prompts, None, max_tokens).tokens
    out: dict[str, Any] = {"prompts": len(prompts), "reference_tokens": sum(map(len, reference))}
    for bits in bits_list:
        run = generate(m, prompts, bits, max_tokens)
        out[f"kv{bits}"] = {
            "greedy": agreement(reference, run.tokens),
            "logprob_drift": drift(m, prompts, reference, bits, at_end=False),
            "logprob_drift_quantized_at_prefill_end": drift(m, prompts, reference, bits, True),
        }
    return out


# -- throughput and bytes ----------------------------------------------------------------------


def throughput(
    m: Model, bits_list: list[int], streams: int, max_tokens: int, repeats: int
) -> dict[str, Any]:
    prompts = bench_prompts(m.tokenizer, streams)
    generate(m, prompts[:2], None, 4)  # warm-up: kernels compiled before anything is timed
    for bits in bits_list:
        generate(m, prompts[:2], bits, 4)
    order: list[int | None] = [None, *bits_list]
    rates: dict[int | None, list[float]] = {bits: [] for bits in order}
    ratios: dict[int, list[float]] = {bits: [] for bits in bits_list}
    for repeat in range(repeats):
        measured: dict[int | None, float] = {}
        for bits in order if repeat % 2 == 0 else order[::-1]:
            run = generate(m, prompts, bits, max_tokens)
            measured[bits] = sum(map(len, run.tokens)) / run.seconds
            rates[bits].append(measured[bits])
        for bits in bits_list:
            ratios[bits].append(measured[bits] / measured[None])
    out: dict[str, Any] = {
        "streams": streams,
        "max_tokens": max_tokens,
        "full_tokens_per_s": statistics.median(rates[None]),
    }
    for bits in bits_list:
        out[f"kv{bits}"] = {
            "tokens_per_s": statistics.median(rates[bits]),
            "ratio": statistics.median(ratios[bits]),
            "ratios": ratios[bits],
        }
    return out


def bytes_per_token(m: Model, bits_list: list[int], dtype: str) -> dict[str, Any]:
    import mlx.core as mx

    m.model.set_dtype(getattr(mx, dtype))
    prompts = bench_prompts(m.tokenizer, 4)
    full = generate(m, prompts, None, 16).bytes_per_token
    out: dict[str, Any] = {"dtype": dtype, "full": full}
    for bits in bits_list:
        held = generate(m, prompts, bits, 16).bytes_per_token
        out[f"kv{bits}"] = {"bytes": held, "ratio": held / full}
    return out


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", default="8,4")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    args = parser.parse_args()
    bits_list = [int(b) for b in args.bits.split(",")]
    print(f"OpenBLAS: {'loaded' if OPENBLAS and openblas_mapped() else 'not loaded'}")
    bench_path = make_bench_model()
    bench = load("bench", bench_path, 64)
    result: dict[str, Any] = {"openblas": bool(OPENBLAS and openblas_mapped()), "bits": bits_list}
    result["throughput"] = throughput(bench, bits_list, args.streams, args.max_tokens, args.repeats)
    report_throughput(result["throughput"], bits_list)
    quality_runs = {
        "bench": quality(
            bench, bench_prompts(bench.tokenizer, args.prompts), bits_list, args.max_tokens
        )
    }
    for name, folder in FIXTURES.items():
        fixture = load(name, folder, 32)
        quality_runs[name] = quality(
            fixture, documented_prompts(fixture.tokenizer, folder), bits_list, args.max_tokens
        )
    result["quality"] = quality_runs
    report_quality(quality_runs, bits_list)
    result["bytes"] = [bytes_per_token(bench, bits_list, d) for d in ("float32", "bfloat16")]
    report_bytes(result["bytes"], bits_list)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"kv_quant-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path.relative_to(ROOT)}")


def report_throughput(t: dict[str, Any], bits_list: list[int]) -> None:
    print(f"\nthroughput, {t['streams']} streams x {t['max_tokens']} tokens (bench model):")
    print(f"  full precision   {t['full_tokens_per_s']:8.0f} tok/s")
    for bits in bits_list:
        row = t[f"kv{bits}"]
        bar = f"  (target >= {TARGET_THROUGHPUT})" if bits == 8 else ""
        print(
            f"  --kv-bits {bits}     {row['tokens_per_s']:8.0f} tok/s  ratio {row['ratio']:.3f}{bar}"
        )


def report_quality(runs: dict[str, Any], bits_list: list[int]) -> None:
    print("\ngreedy agreement with full precision and chosen-token logprob drift:")
    for name, q in runs.items():
        print(f"  {name}: {q['prompts']} prompts, {q['reference_tokens']} reference tokens")
        for bits in bits_list:
            row = q[f"kv{bits}"]
            g, d, e = (
                row["greedy"],
                row["logprob_drift"],
                row["logprob_drift_quantized_at_prefill_end"],
            )
            print(
                f"    kv{bits}: until first divergence {g['until_first_divergence']:.3f}, "
                f"position-wise {g['position_wise']:.3f}, identical {g['identical_outputs']:.3f}; "
                f"|drift| mean {d['mean_abs']:.4f} max {d['max_abs']:.4f} "
                f"(quantized at prefill end: mean {e['mean_abs']:.4f} max {e['max_abs']:.4f})"
            )


def report_bytes(rows: list[dict[str, Any]], bits_list: list[int]) -> None:
    print("\nKV bytes per token (all layers, bench model):")
    for row in rows:
        parts = ", ".join(
            f"kv{b} {row[f'kv{b}']['bytes']:.0f} ({row[f'kv{b}']['ratio']:.3f}x)" for b in bits_list
        )
        bar = f"  (kv8 target <= {TARGET_BYTES})" if row["dtype"] == "bfloat16" else ""
        print(f"  {row['dtype']}: full {row['full']:.0f}, {parts}{bar}")


if __name__ == "__main__":
    main()
