"""Constrained-decoding overhead per token: json_schema against unconstrained, same prompt.

Run::

    .venv/bin/python bench/constrained.py [--vocab 150000] [--max-tokens 200] [--repeats 3]
        [--skip-large]

Two models: the bundled tiny model (its 588-token vocabulary) and a random-weight Qwen3 with a
byte-level BPE tokenizer of ``--vocab`` tokens (default 150,000, Qwen's size). The large one is
written once to ``bench/models/qwen3-random-vocab<N>/`` (git-ignored): the tokenizer is trained
with ``tokenizers`` on the first 40 MB of text found under this virtualenv's ``site-packages``
(~30 s), with the bundled tokenizer's Qwen2 pre-tokenizer, special tokens and non-special
``<think>``/``<tool_call>`` tokens; the model has the bundled model's shape with the larger
vocabulary (tied embeddings) and zero logits for end-of-sequence tokens, so unconstrained greedy
decoding never stops early.

For each model:

1. End to end: ``mlx_lm.generate.stream_generate``, greedy, one sequence, the same prompt, with
   and without a ``json_schema`` processor from ``mlx_responses.engine.constrain``; the schema's
   array has ``minItems`` so constrained output also runs to ``--max-tokens``. Runs alternate;
   ms/token is reported as the minimum and the median over runs (wall clock) and the median of
   CPU time (all of this process's threads): on a shared machine the minimum is the steadiest
   estimate of the cost itself, the median shows the spread.
2. Replay, the figure the target is about: the constrained run's tokens are fed again to a fresh
   matcher, timing per token (a) llguidance's mask computation, (b) unpacking the bitmask into a
   boolean mx array (numpy ``unpackbits``, what the processor does; and, for comparison, MLX
   shifts on the uint32 words), (c) applying it (``mx.where`` + evaluation) to logits of the
   model's width. (a)+(b)+(c) is the processor's own cost per token. Target: under 1 ms at 150k.

Results are printed and written to ``bench/results/constrained-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import mlx_responses  # noqa: F401 - preloads OpenBLAS before MLX (issue 16)

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "src" / "engine" / "bundled"
MODELS_DIR = ROOT / "bench" / "models"
RESULTS_DIR = ROOT / "bench" / "results"
TARGET_MS = 1.0
CORPUS_BYTES = 40_000_000
SEED = 20240611
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
PROMPT = "Count from 1 to 110."

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "items": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "qty": {"type": "integer", "minimum": 0, "maximum": 999},
                    "ok": {"type": "boolean"},
                    "kind": {"enum": ["fruit", "vegetable", "other"]},
                },
                "required": ["name", "qty", "ok", "kind"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["title", "items"],
    "additionalProperties": False,
}


# -- the large-vocabulary model --------------------------------------------------------------------


def _corpus(limit: int) -> Iterator[str]:
    root = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    files = sorted(
        p
        for p in (root / "site-packages").rglob("*")
        if p.suffix in {".py", ".pyi", ".md", ".rst", ".txt"} and p.is_file()
    )
    seen = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        seen += len(text)
        yield text
        if seen >= limit:
            return


def _train_tokenizer(vocab: int, out: Path) -> int:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    source = json.loads((BUNDLED / "tokenizer.json").read_text())
    pattern = source["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - len(ADDED),
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(CORPUS_BYTES), trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tokenizer.save(str(out / "tokenizer.json"))
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def ensure_large_model(vocab: int) -> Path:
    """``bench/models/qwen3-random-vocab<vocab>/``, written if missing."""
    out = MODELS_DIR / f"qwen3-random-vocab{vocab // 1000}k"
    if (out / "model.safetensors").is_file():
        return out
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    print(f"writing {out.relative_to(ROOT)} (tokenizer training takes ~30 s) ...", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    size = _train_tokenizer(vocab, tmp)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(BUNDLED / name, tmp / name)
    eos = json.loads((tmp / "tokenizer.json").read_text())
    eos_id = next(t["id"] for t in eos["added_tokens"] if t["content"] == "<|im_end|>")
    config = json.loads((BUNDLED / "config.json").read_text())
    config.update(vocab_size=size, eos_token_id=eos_id, bos_token_id=None, pad_token_id=None)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.random.seed(SEED)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    embed = model.model.embed_tokens
    weight = mx.random.normal(embed.weight.shape, dtype=mx.float32)
    # Tied embeddings: a zero row gives the EOS token a zero logit, below the random maximum.
    weight[eos_id] = 0.0
    embed.weight = weight
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


# -- measurements ----------------------------------------------------------------------------------


def _generate(
    model: Any, tokenizer: Any, prompt: list[int], max_tokens: int, processors: list[Any]
) -> tuple[list[int], float, float]:
    """Tokens, then wall and CPU (this process, all threads) milliseconds per token."""
    from mlx_lm.generate import stream_generate

    tokens: list[int] = []
    start, cpu = time.perf_counter(), time.process_time()
    for response in stream_generate(
        model, tokenizer, prompt, max_tokens=max_tokens, logits_processors=processors
    ):
        tokens.append(int(response.token))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return tokens, wall / len(tokens) * 1e3, cpu / len(tokens) * 1e3


def _stats(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "mean": statistics.fmean(ms),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


def _replay(constraints: Any, grammar: Any, tokens: list[int], width: int) -> dict[str, Any]:
    import mlx.core as mx

    matcher = grammar.new_matcher()
    words = (constraints.vocab_size + 31) // 32
    buffer = np.zeros(words * 4, dtype=np.uint8)
    shifts = mx.arange(32, dtype=mx.uint32)
    logits = mx.random.normal((1, width))
    mx.eval(logits, shifts)
    phases: dict[str, list[float]] = {"compute": [], "unpack": [], "apply": [], "unpack_mx": []}
    count = min(width, constraints.vocab_size)
    for token in tokens:
        if matcher.is_stopped():
            break
        t0 = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(buffer.ctypes.data, buffer.nbytes)
        t1 = time.perf_counter()
        bits = np.unpackbits(buffer, bitorder="little", count=count)
        if width > count:
            bits = np.concatenate([bits, np.zeros(width - count, dtype=np.uint8)])
        mask = mx.array(bits.view(np.bool_))
        t2 = time.perf_counter()
        out = mx.where(mask, logits, -mx.inf)
        mx.eval(out)
        t3 = time.perf_counter()
        # The alternative: unpack the uint32 words with MLX shifts (evaluated to time it).
        packed = mx.array(buffer.view(np.uint32))
        alt = ((packed[:, None] >> shifts) & 1).reshape(-1)[:count] != 0
        mx.eval(alt)
        t4 = time.perf_counter()
        for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            phases[name].append(seconds * 1e3)
        if not matcher.consume_token(token):
            raise RuntimeError(f"replay rejected token {token}: {matcher.get_error()}")
    parts = zip(phases["compute"], phases["unpack"], phases["apply"], strict=True)
    total = [c + u + a for c, u, a in parts]
    return {
        "steps": len(total),
        "first_ms": total[0] if total else 0.0,
        "per_token_ms": _stats(total[1:] or total),
        **{f"{name}_ms": _stats(v[1:] or v) for name, v in phases.items()},
    }


def bench_model(path: Path, label: str, max_tokens: int, repeats: int) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm import load

    from mlx_responses.engine.constrain import Constraints, make_logits_processor

    model, tokenizer = load(str(path))[:2]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    start = time.perf_counter()
    constraints = Constraints(tokenizer)
    init_s = time.perf_counter() - start
    start = time.perf_counter()
    grammar = constraints.json_schema(SCHEMA)
    compile_s = time.perf_counter() - start
    width = int(model(mx.array([prompt[:1]])).shape[-1])

    _generate(model, tokenizer, prompt, 8, [])  # warm-up (kernel JIT)
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    recorded: list[int] = []
    for i in range(repeats):
        order = (False, True) if i % 2 == 0 else (True, False)
        for use in order:
            processors = [make_logits_processor(constraints, grammar)] if use else []
            tokens, wall_ms, cpu_ms = _generate(model, tokenizer, prompt, max_tokens, processors)
            runs[use].append((wall_ms, cpu_ms))
            if use:
                recorded = tokens
    text = tokenizer.decode(recorded)
    replay = _replay(constraints, grammar, recorded, width)

    def summary(use: bool) -> dict[str, float]:
        wall = [w for w, _ in runs[use]]
        cpu = [c for _, c in runs[use]]
        return {
            "wall_min_ms": min(wall),
            "wall_median_ms": statistics.median(wall),
            "cpu_median_ms": statistics.median(cpu),
        }

    plain, constrained = summary(False), summary(True)
    return {
        "model": label,
        "vocab": constraints.vocab_size,
        "logits_width": width,
        "constraints_init_s": init_s,
        "grammar_compile_s": compile_s,
        "tokens": len(recorded),
        "unconstrained": plain,
        "constrained": constrained,
        # tokens/s ratio = inverse ratio of ms/token
        "tps_ratio_min": plain["wall_min_ms"] / constrained["wall_min_ms"],
        "tps_ratio_median": plain["wall_median_ms"] / constrained["wall_median_ms"],
        "overhead_ms_min": constrained["wall_min_ms"] - plain["wall_min_ms"],
        "overhead_ms_median": constrained["wall_median_ms"] - plain["wall_median_ms"],
        "replay": replay,
        "sample_output": text[:160],
    }


def report(result: dict[str, Any]) -> None:
    r = result["replay"]
    print(
        f"\n== {result['model']}: vocabulary {result['vocab']:,} (logits {result['logits_width']:,})"
    )
    print(
        f"Constraints() {result['constraints_init_s'] * 1e3:.0f} ms; "
        f"json_schema compile {result['grammar_compile_s'] * 1e3:.1f} ms"
    )
    print(f"output ({result['tokens']} tokens): {result['sample_output']!r}")
    p, c = result["unconstrained"], result["constrained"]
    print("end to end (ms/token; tok/s ratio = constrained / unconstrained tokens per second):")
    print(f"  {'':<16}{'wall min':>10}{'wall median':>13}{'cpu median':>12}")
    for name, s in (("unconstrained", p), ("json_schema", c)):
        print(
            f"  {name:<16}{s['wall_min_ms']:>10.3f}{s['wall_median_ms']:>13.3f}"
            f"{s['cpu_median_ms']:>12.3f}"
        )
    print(
        f"  tok/s ratio {result['tps_ratio_min']:.3f} (min), {result['tps_ratio_median']:.3f} "
        f"(median); overhead {result['overhead_ms_min']:+.3f} ms/token (min), "
        f"{result['overhead_ms_median']:+.3f} (median)"
    )
    print(
        f"replay over {r['steps']} tokens (ms/token, first step {r['first_ms']:.3f} ms excluded):"
    )
    print(f"  {'phase':<28}{'mean':>8}{'p50':>8}{'p99':>8}{'max':>8}")
    rows = (
        ("llguidance mask", "compute_ms"),
        ("unpack (numpy) + to mx", "unpack_ms"),
        ("apply (mx.where + eval)", "apply_ms"),
        ("= processor total", "per_token_ms"),
        ("(alt: unpack with mx shifts)", "unpack_mx_ms"),
    )
    for name, key in rows:
        s = r[key]
        print(f"  {name:<28}{s['mean']:>8.3f}{s['p50']:>8.3f}{s['p99']:>8.3f}{s['max']:>8.3f}")
    verdict = "meets" if r["per_token_ms"]["mean"] < TARGET_MS else "MISSES"
    print(f"  target < {TARGET_MS} ms/token (mean): {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vocab", type=int, default=150_000)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true", help="only the bundled model")
    args = parser.parse_args(argv)

    results = [bench_model(BUNDLED, "bundled tiny model", args.max_tokens, args.repeats)]
    report(results[-1])
    if not args.skip_large:
        path = ensure_large_model(args.vocab)
        results.append(
            bench_model(path, f"random Qwen3, {path.name}", args.max_tokens, args.repeats)
        )
        report(results[-1])
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"constrained-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"machine": platform.platform(), "processor": platform.processor(), "argv": sys.argv}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"\nwritten {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
