"""A random-weight hybrid model whose KV cache cannot be trimmed (issue 12's segment checkpoints).

mlx-lm's LFM2 alternates short-convolution layers (an ``ArraysCache`` of recurrent state: not
trimmable) with attention layers (a plain ``KVCache``), so ``can_trim_prompt_cache`` is false for
its cache: the prompt cache may only reuse exact prefixes. The model reuses the bundled
tokenizer and chat template, with deterministic random weights (small embeddings keep greedy
output varied rather than one repeated token)::

    .venv/bin/python -m tests.hybrid_model OUT [--hidden 64] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import mlx_responses  # noqa: F401 - preloads OpenBLAS before MLX (issue 16)
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SEED = 7
EMBED_SCALE = 0.05


def hybrid_config(hidden: int = 64, layers: int = 4) -> dict[str, Any]:
    bundled = json.loads((Path(BUNDLED_MODEL_PATH) / "config.json").read_text())
    return {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "vocab_size": bundled["vocab_size"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": hidden,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "block_ff_dim": 2 * hidden,
        # Odd layers attend; even ones are convolutions (recurrent state).
        "full_attn_idxs": list(range(1, layers, 2)),
        "eos_token_id": bundled["eos_token_id"],
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def make_hybrid_model(out: Path, hidden: int = 64, layers: int = 4) -> Path:
    """Write the model to ``out`` (made if missing); return ``out``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import lfm2

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(Path(BUNDLED_MODEL_PATH) / name, out / name)
    config = hybrid_config(hidden, layers)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.random.seed(SEED)
    model = lfm2.Model(lfm2.ModelArgs.from_dict(config))
    embed = model.model.embed_tokens
    embed.weight = mx.random.normal(embed.weight.shape, dtype=mx.float32) * EMBED_SCALE
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    print(make_hybrid_model(args.out, args.hidden, args.layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
