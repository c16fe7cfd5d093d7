"""Build the per-family fixtures in ``tests/fixtures/families/<family>/``, deterministically.

For each family of ``scripts/family_specs.py``: a tiny model of the family's own mlx-lm
architecture class (``config.json``, ``model.safetensors``), a byte-level BPE tokenizer carrying
the family's marker tokens whole (``tokenizer.json``, ``tokenizer_config.json``), the family's
real chat template (``chat_template.jinja``, committed, never written here) and ``prompts.json``:
the documented prompts, rendered by that template, whose greedy completions (a tool call,
reasoning, plain text, in the family's notation) the weights reproduce. As the bundled model
(``scripts/build_tiny_model.py``): a seeded random init, then full-batch Adam on those chats with
the loss on the completion tokens only.

Run: ``.venv/bin/python scripts/build_family_fixtures.py [FAMILY ...]`` (all by default). Each
family is built in a temporary folder and checked through ``mlx_lm.load``; only a family whose
every prompt reproduces is copied into place. Same machine, same files: fixed corpus, seeds,
data order and step count, single-threaded tokenizer training.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# isort: off
import mlx_responses  # noqa: F401  (importing it preloads OpenBLAS: before MLX)

# isort: on
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_specs import FAMILIES, Family, Prompt

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "families"
BUILT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "prompts.json",
)
SEED = 20260401
LEARNING_RATE = 1e-2
WARMUP_STEPS = 20
MIN_MARGIN = 1.0
BPE_VOCAB_SIZE = 1024
EMBED_SCALE = 0.05
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
EXTRA_CORPUS = """\
The quick brown fox jumps over the lazy dog. You are a helpful assistant. Answer briefly.
What is the weather like today? It is sunny and warm. The temperature is 18 degrees.
Think step by step, then give the final answer. Use the tool to look up the answer.
def main(): return {"status": "ok", "items": [1, 2, 3], "error": null, "done": true}
"""


def family_dir(family: Family) -> Path:
    return FIXTURES / family.name


def template_text(family: Family) -> str:
    return (family_dir(family) / "chat_template.jinja").read_text(encoding="utf-8")


@contextlib.contextmanager
def today(date: str | None) -> Iterator[None]:
    """Pin the date the template's ``strftime_now`` reads (transformers calls ``datetime.now``)."""
    if date is None:
        yield
        return
    from transformers.utils import chat_template_utils

    real = chat_template_utils.datetime
    fixed = datetime.datetime.fromisoformat(date)

    class _Pinned(datetime.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return fixed

    chat_template_utils.datetime = _Pinned  # type: ignore[misc]
    try:
        yield
    finally:
        chat_template_utils.datetime = real  # type: ignore[misc]


# --- tokenizer ------------------------------------------------------------------------------


def _bare_tokenizer(family: Family) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _trainer(family: Family) -> trainers.BpeTrainer:
    return trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in family.special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )


def write_tokenizer(family: Family, out: Path, corpus: list[str]) -> Tokenizer:
    """Train the BPE merges on ``corpus`` (markers cut out) and write the tokenizer files."""
    markers = sorted(family.special + family.markup, key=len, reverse=True)
    cleaned = []
    for text in corpus:
        for marker in markers:
            text = text.replace(marker, "\n")
        cleaned.append(text)
    tokenizer = _bare_tokenizer(family)
    tokenizer.train_from_iterator(cleaned, trainer=_trainer(family))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.markup])
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": family.bos,
        "eos_token": family.eos,
        "pad_token": family.pad,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "split_special_tokens": False,
    }
    write_json(out / "tokenizer_config.json", config)
    return tokenizer


def render_texts(family: Family, out: Path) -> list[str]:
    """Every prompt and completion as text, rendered by the real template (tokenizer corpus)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    bare = _bare_tokenizer(family)
    bare.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.special])
    bare.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"})
    wrapper = load_tokenizer(out)
    texts = EXTRA_CORPUS.splitlines()
    for prompt in family.prompts:
        for date in family.dates[:1] or [None]:
            with today(date):
                text = wrapper.apply_chat_template(
                    prompt.messages,
                    tools=prompt.tools,
                    add_generation_prompt=True,
                    tokenize=False,
                    **(prompt.kwargs or {}),
                )
            texts.append(text)
        texts.append(prompt.completion)
    return texts


# --- model ----------------------------------------------------------------------------------


def model_config(family: Family, tokenizer: Tokenizer) -> dict[str, Any]:
    config = json.loads(json.dumps(family.config))
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    config["vocab_size"] = vocab
    if family.text_config:
        config["text_config"]["vocab_size"] = vocab
    stops = [tokenizer.token_to_id(t) for t in family.stops]
    assert None not in stops, family.stops
    config["eos_token_id"] = stops
    config["pad_token_id"] = tokenizer.token_to_id(family.pad)
    if family.bos is not None:
        config["bos_token_id"] = tokenizer.token_to_id(family.bos)
    config["torch_dtype"] = "float32"
    return dict(sorted(config.items()))


def make_model(config: dict[str, Any]) -> nn.Module:
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model: nn.Module = model_class(args_class.from_dict(config))
    # Small embeddings keep a random init's logits near uniform, so training starts level.
    embeddings = [
        (name, mx.random.normal(value.shape) * EMBED_SCALE)
        for name, value in tree_flatten(model.parameters())
        if name.endswith("embed_tokens.weight")
    ]
    model.load_weights(embeddings, strict=False)
    mx.eval(model.parameters())
    return model


Example = tuple[list[int], int]  # token ids, index of the first completion token


def examples(family: Family, wrapper: Any, dates: list[str | None]) -> list[list[Example]]:
    """Per prompt, one example per date: prompt ids + completion ids + the stop token."""
    result = []
    for prompt in family.prompts:
        completion = wrapper.encode(prompt.completion, add_special_tokens=False)
        assert wrapper.decode(completion) == prompt.completion, prompt.completion
        stop = wrapper.convert_tokens_to_ids(prompt.stop)
        per_date = []
        for date in dates:
            ids = render(wrapper, prompt, date)
            per_date.append((ids + completion + [stop], len(ids)))
        result.append(per_date)
    return result


def render(wrapper: Any, prompt: Prompt, date: str | None) -> list[int]:
    with today(date):
        return list(
            wrapper.apply_chat_template(
                prompt.messages,
                tools=prompt.tools,
                add_generation_prompt=True,
                **(prompt.kwargs or {}),
            )
        )


def train(model: nn.Module, rounds: list[list[Example]], steps: int) -> float:
    """Adam on every prompt each step, one forward each; step ``i`` takes the prompts rendered
    under ``rounds[i % len(rounds)]`` (one per trained date), so the model learns to ignore what
    varies between rounds. Loss on the completion tokens only."""

    def batch(data: list[Example]) -> list[tuple[mx.array, mx.array, mx.array]]:
        return [
            (mx.array(ids[:-1]), mx.array(ids[1:]), mx.arange(len(ids) - 1) >= (start - 1))
            for ids, start in data
        ]

    prepared = [batch(data) for data in rounds]
    totals = [sum(len(ids) - start for ids, start in data) for data in rounds]
    current = {"round": 0}

    def loss_fn(m: nn.Module) -> mx.array:
        loss = mx.array(0.0)
        for x, y, mask in prepared[current["round"]]:
            logits = m(x[None])[0].astype(mx.float32)
            ce = nn.losses.cross_entropy(logits, y, reduction="none")
            loss = loss + (ce * mask).sum()
        return loss / totals[current["round"]]

    def schedule(step: mx.array) -> mx.array:
        warm = mx.minimum(1.0, (step + 1) / WARMUP_STEPS)
        decay = 0.5 * (1 + mx.cos(math.pi * mx.minimum(step / steps, 1.0)))
        return LEARNING_RATE * warm * (0.1 + 0.9 * decay)

    optimizer = optim.Adam(learning_rate=schedule)
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    loss = mx.array(0.0)
    started = time.perf_counter()
    for step in range(steps):
        current["round"] = step % len(rounds)
        loss, grads = loss_and_grad(model)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - started
            print(f"  step {step:4d}  loss {loss.item():.5f}  {elapsed:6.1f} s", flush=True)
    return float(loss.item())


def min_margin(model: nn.Module, data: list[Example]) -> float:
    worst = math.inf
    for ids, start in data:
        logits = model(mx.array(ids[:-1])[None])[0][start - 1 :].astype(mx.float32)
        target = mx.array(ids[start:])
        right = mx.take_along_axis(logits, target[:, None], axis=-1)[:, 0]
        others = mx.put_along_axis(logits, target[:, None], mx.array(-math.inf), axis=-1)
        worst = min(worst, float((right - others.max(axis=-1)).min().item()))
    return worst


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- one family -----------------------------------------------------------------------------


def build(family: Family, out: Path, steps: int) -> int:
    """Write the built files of ``family`` into ``out``; return the number of failures."""
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    started = time.perf_counter()
    mx.random.seed(SEED)
    shutil.copyfile(family_dir(family) / "chat_template.jinja", out / "chat_template.jinja")
    tokenizer = write_tokenizer(family, out, render_texts(family, out))
    config = model_config(family, tokenizer)
    write_json(out / "config.json", config)
    wrapper = load_tokenizer(out)
    # Dates: every step trains on one of the trained dates; the unseen ones are only checked.
    trained_dates: list[str | None] = list(family.dates[:-2]) or [None]
    unseen_dates: list[str | None] = list(family.dates[-2:])
    per_prompt = examples(family, wrapper, trained_dates)
    rounds = [list(round_) for round_ in zip(*per_prompt, strict=True)]
    train_data = [ex for round_ in rounds for ex in round_]
    mx.random.seed(SEED)
    model = make_model(config)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"{family.name}: vocab {config['vocab_size']}, params {n_params:,}", flush=True)
    final_loss = train(model, rounds, steps)
    margin = min_margin(model, train_data)
    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})

    loaded, loaded_tokenizer = load(str(out))
    sampler = make_sampler(temp=0.0)
    failures = 0
    records = []
    for prompt, per_date in zip(family.prompts, examples(family, wrapper, [None]), strict=True):
        ids, start = per_date[0]
        for date in [*trained_dates, *unseen_dates] if family.dates else [None]:
            tokens: list[int] = []
            for response in stream_generate(
                loaded,
                loaded_tokenizer,
                render(loaded_tokenizer, prompt, date),
                max_tokens=len(ids) - start + 10,
                sampler=sampler,
            ):
                tokens.append(response.token)
            text = wrapper.decode(tokens[:-1])
            stop = wrapper.convert_ids_to_tokens(tokens[-1]) if tokens else None
            ok = text == prompt.completion and stop == prompt.stop
            failures += not ok
            if not ok:
                print(f"  {prompt.name} @ {date}: FAIL {text!r} then {stop!r}")
        records.append(
            {
                "name": prompt.name,
                "messages": prompt.messages,
                "tools": prompt.tools,
                "completion": prompt.completion,
                "stop": prompt.stop,
                "completion_tokens": len(ids) - start - 1,
                **({"template_kwargs": prompt.kwargs} if prompt.kwargs else {}),
            }
        )
    write_json(out / "prompts.json", records)
    if margin < MIN_MARGIN:
        print(f"  min logit margin {margin:.2f} is below {MIN_MARGIN}: train longer")
        failures += 1
    size = sum((out / name).stat().st_size for name in BUILT_FILES)
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]
    print(
        f"  final loss {final_loss:.5f}, min margin {margin:.2f}, {size / 1e6:.2f} MB, "
        f"sha256 {digest}, {time.perf_counter() - started:.1f} s, {failures} failure(s)",
        flush=True,
    )
    return failures


def build_into(family: Family, target: Path, steps: int) -> int:
    """Build ``family`` aside and copy its built files into ``target`` when it passes."""
    with tempfile.TemporaryDirectory(prefix=f"family-{family.name}-") as tmp:
        failures = build(family, Path(tmp), steps)
        if failures:
            return failures
        target.mkdir(parents=True, exist_ok=True)
        for name in BUILT_FILES:
            shutil.copyfile(Path(tmp) / name, target / name)
        if not (target / "chat_template.jinja").exists():
            shutil.copyfile(Path(tmp) / "chat_template.jinja", target / "chat_template.jinja")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--steps", type=int, default=None, help="default: the family's")
    parser.add_argument("--out", type=Path, default=None, help="build under this folder")
    args = parser.parse_args()
    failed = []
    for name in args.families:
        family = FAMILIES[name]
        target = (args.out / name) if args.out else family_dir(family)
        if build_into(family, target, args.steps or family.steps):
            failed.append(name)
    if failed:
        print(f"not written: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
