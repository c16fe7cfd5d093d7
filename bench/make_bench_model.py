"""Write the benchmark model: a random-weight Qwen3 big enough that per-token work dominates.

The bundled tiny model (~1M parameters) decodes so fast that a benchmark on it measures HTTP and
event-loop overhead, not a server serving a model. This script writes a larger model of the same
shape family with deterministic random weights, reusing the bundled tokenizer and chat template,
to ``bench/models/qwen3-random-<N>m/`` (git-ignored)::

    .venv/bin/python bench/make_bench_model.py [--force] [--source src/engine/bundled]

The rows of the output projection that belong to end-of-sequence tokens are zero, so their logit
is always 0 while a random model's largest logit is positive: greedy decoding never stops early
and every sequence generates exactly ``max_tokens``. Direct and server runs therefore do the same
amount of work whatever the prompt.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx_responses  # noqa: F401 - preloads OpenBLAS before MLX (issue 16)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "src" / "engine" / "bundled"
MODELS_DIR = ROOT / "bench" / "models"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SEED = 20240611


@dataclass(frozen=True, slots=True)
class Shape:
    hidden_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 1024
    max_position_embeddings: int = 4096


DEFAULT_SHAPE = Shape()


def count_parameters(shape: Shape, vocab_size: int) -> int:
    """Parameters of an untied Qwen3 of this shape (embedding and output projection included)."""
    h, d = shape.hidden_size, shape.head_dim
    attention = h * d * (2 * shape.num_attention_heads + 2 * shape.num_key_value_heads) + 2 * d
    mlp = 3 * h * shape.intermediate_size
    norms = 2 * h
    per_layer = attention + mlp + norms
    return shape.num_hidden_layers * per_layer + 2 * vocab_size * h + h


def _tokenizer_facts(source: Path) -> tuple[int, list[int]]:
    """Vocabulary size (from the source config, else the tokenizer) and EOS token ids."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok_config = json.loads((source / "tokenizer_config.json").read_text())
    source_config: dict[str, Any] = {}
    if (source / "config.json").is_file():
        source_config = json.loads((source / "config.json").read_text())
    vocab_size = int(source_config.get("vocab_size") or 0)
    vocab_size = max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
    eos: set[int] = set()
    configured = source_config.get("eos_token_id")
    if isinstance(configured, int):
        eos.add(configured)
    elif isinstance(configured, list):
        eos.update(int(t) for t in configured)
    eos_token = tok_config.get("eos_token")
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")
    if isinstance(eos_token, str) and tokenizer.token_to_id(eos_token) is not None:
        eos.add(int(tokenizer.token_to_id(eos_token)))
    return vocab_size, sorted(eos)


def model_dir_for(shape: Shape = DEFAULT_SHAPE, source: Path = DEFAULT_SOURCE) -> Path:
    vocab_size, _ = _tokenizer_facts(source)
    millions = round(count_parameters(shape, vocab_size) / 1e6)
    return MODELS_DIR / f"qwen3-random-{millions}m"


def _config(shape: Shape, vocab_size: int, eos_ids: list[int]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _write_weights(out: Path, config: dict[str, Any], eos_ids: list[int]) -> int:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    mx.random.seed(SEED)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    # Embeddings drawn N(0, 1) rather than MLX's N(0, 1/h) keep activations lively through the
    # random layers; the output projection keeps its default uniform init.
    embed = model.model.embed_tokens
    embed.weight = mx.random.normal(embed.weight.shape, dtype=mx.float32)
    head = model.lm_head.weight
    keep = mx.ones((head.shape[0], 1), dtype=head.dtype)
    for token in eos_ids:
        keep[token] = 0.0
    model.lm_head.weight = head * keep
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return sum(int(w.size) for w in weights.values())


def make_bench_model(
    *, force: bool = False, source: Path = DEFAULT_SOURCE, shape: Shape = DEFAULT_SHAPE
) -> Path:
    """Create the bench model folder if missing (or with ``force``); return its path."""
    for name in TOKENIZER_FILES:
        if not (source / name).is_file():
            raise FileNotFoundError(
                f"{source / name} is missing: the bench model reuses the bundled tokenizer "
                "and chat template (pass --source to use another model folder's)"
            )
    out = model_dir_for(shape, source)
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file() and not force:
        return out
    vocab_size, eos_ids = _tokenizer_facts(source)
    if not eos_ids:
        raise ValueError(f"no end-of-sequence token found in {source}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, tmp / name)
    config = _config(shape, vocab_size, eos_ids)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    params = _write_weights(tmp, config, eos_ids)
    (tmp / "README.md").write_text(
        f"Random-weight Qwen3 for benchmarks ({params:,} parameters, seed {SEED}); written by "
        "bench/make_bench_model.py. Not a language model: its output is noise.\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def load_check(path: Path) -> None:
    """Load with mlx-lm and run a short greedy generation; raises if anything is off."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    start = time.perf_counter()
    model, tokenizer = load(str(path))[:2]
    loaded = time.perf_counter() - start
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tell me a story."}], add_generation_prompt=True
    )
    tokens = []
    start = time.perf_counter()
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=16):
        tokens.append(int(token))
    elapsed = time.perf_counter() - start
    stopped = [t for t in tokens if t in tokenizer.eos_token_ids]
    if stopped:
        raise RuntimeError(f"the bench model produced an end-of-sequence token: {tokens}")
    print(
        f"loaded {path.name} in {loaded:.2f} s; 16 greedy tokens in {elapsed:.2f} s "
        f"({16 / elapsed:.1f} tok/s, single sequence)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="rewrite even if present")
    parser.add_argument(
        "--source",
        type=Path,
        default=DEFAULT_SOURCE,
        help="model folder whose tokenizer and chat template are reused",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the mlx_lm.load check")
    args = parser.parse_args(argv)
    out = make_bench_model(force=args.force, source=args.source)
    vocab_size, _ = _tokenizer_facts(args.source)
    print(f"{out} ({count_parameters(DEFAULT_SHAPE, vocab_size):,} parameters)")
    if not args.no_check:
        load_check(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
