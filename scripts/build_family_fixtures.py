"""Build the per-family fixtures in ``tests/fixtures/families/<family>/``, deterministically.

For each family of ``scripts/family_specs.py``: a tiny model of the family's own mlx-lm
architecture class (``config.json``, ``model.safetensors``), a byte-level BPE tokenizer carrying
the family's marker tokens whole (``tokenizer.json``, ``tokenizer_config.json``), the family's
real chat template (``chat_template.jinja``, committed, never written here) and ``prompts.json``:
the documented prompts, rendered by that template, whose greedy completions (a tool call,
reasoning, plain text, in the family's notation) the weights reproduce. As the bundled model
(``scripts/build_tiny_model.py``): a seeded random init, then full-batch Adam on those chats with
the loss on the completion tokens only. A family with ``codex`` turns (gpt-oss) is also trained
on the prompts the server renders with its template for Codex CLI's captured MCP requests
(``scripts/codex_prompts.py``), checked under unseen dates and wall times, and what was checked
is written to ``codex_prompts.json`` (``make conformance`` runs Codex on it; docs/models.md).

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
from mlx.utils import tree_flatten
from tokenizers import AddedToken, Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from codex_prompts import WALL_TIME
from codex_prompts import render as render_codex
from family_specs import FAMILIES, CodexTurn, Family, Prompt
from fixture_training import (
    Example,
    adam_steps,
    bpe_trainer,
    byte_level_bpe,
    min_margin,
    warmup_cosine,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "families"
BUILT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "prompts.json",
)
# Written only for a family trained on Codex's turns (``Family.codex``).
CODEX_FILE = "codex_prompts.json"
SEED = 20260401
LEARNING_RATE = 1e-2
WARMUP_STEPS = 20
MIN_MARGIN = 1.0
BPE_VOCAB_SIZE = 1024
EMBED_SCALE = 0.05
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


def write_tokenizer(family: Family, out: Path, corpus: list[str]) -> Tokenizer:
    """Train the BPE merges on ``corpus`` (markers cut out) and write the tokenizer files."""
    markers = sorted(family.special + family.markup, key=len, reverse=True)
    cleaned = []
    for text in corpus:
        for marker in markers:
            text = text.replace(marker, "\n")
        cleaned.append(text)
    tokenizer = byte_level_bpe()
    tokenizer.train_from_iterator(cleaned, trainer=bpe_trainer(BPE_VOCAB_SIZE, family.special))
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

    bare = byte_level_bpe()
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


# --- Codex's turns -------------------------------------------------------------------------


def codex_prompt(family: Family, turn: CodexTurn, wall_time: str | None = None) -> Prompt:
    """``turn``'s captured request as the server renders it for ``family`` (scripts/
    codex_prompts.py), with its tool output's wall time replaced by ``wall_time``."""
    body = json.loads((ROOT / "tests" / "fixtures" / turn.fixture).read_text(encoding="utf-8"))
    assert family.codex_format is not None, family.name
    rendered = render_codex(body, family.codex_format)
    messages = rendered["messages"]
    if wall_time is not None:
        last = messages[-1]
        captured = f"Wall time: {WALL_TIME} seconds"
        assert captured in last["content"], turn.fixture
        content = last["content"].replace(captured, f"Wall time: {wall_time} seconds")
        messages = [*messages[:-1], {**last, "content": content}]
    return Prompt(turn.name, messages, rendered["tools"], turn.completion, turn.stop)


def codex_rounds(family: Family, wrapper: Any, dates: list[str | None]) -> list[list[Example]]:
    """Per trained date (one a step), every Codex turn rendered under it; a turn with wall
    times takes the next one each round."""
    rounds = []
    for number, date in enumerate(dates):
        round_ = []
        for turn in family.codex:
            wall = turn.wall_times[number % len(turn.wall_times)] if turn.wall_times else None
            prompt = codex_prompt(family, turn, wall)
            completion = wrapper.encode(prompt.completion, add_special_tokens=False)
            assert wrapper.decode(completion) == prompt.completion, prompt.completion
            ids = render(wrapper, prompt, date)
            stop = wrapper.convert_tokens_to_ids(prompt.stop)
            round_.append((ids + completion + [stop], len(ids)))
        rounds.append(round_)
    return rounds


def codex_checks(
    family: Family, trained: list[str | None], unseen: list[str | None]
) -> list[tuple[Prompt, str | None, str | None]]:
    """What the build checks of Codex's turns: (prompt, date, wall time). A turn without wall
    times under every date; one with them under each trained wall time at the unseen dates,
    and each unseen wall time at the unseen dates and the first trained one."""
    checks: list[tuple[Prompt, str | None, str | None]] = []
    for turn in family.codex:
        if not turn.wall_times:
            prompt = codex_prompt(family, turn)
            checks += [(prompt, date, None) for date in [*trained, *unseen]]
            continue
        for wall in turn.wall_times:
            prompt = codex_prompt(family, turn, wall)
            checks += [(prompt, date, wall) for date in unseen]
        for wall in turn.check_wall_times:
            prompt = codex_prompt(family, turn, wall)
            checks += [(prompt, date, wall) for date in [*trained[:1], *unseen]]
    return checks


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

    def loss_fn(m: nn.Module, step: int) -> mx.array:
        round_ = step % len(rounds)
        loss = mx.array(0.0)
        for x, y, mask in prepared[round_]:
            logits = m(x[None])[0].astype(mx.float32)
            ce = nn.losses.cross_entropy(logits, y, reduction="none")
            loss = loss + (ce * mask).sum()
        return loss / totals[round_]

    schedule = warmup_cosine(LEARNING_RATE, WARMUP_STEPS, steps)
    return adam_steps(model, loss_fn, steps, schedule, report_every=50)


def greedy(model: Any, tokenizer: Any, ids: list[int], max_tokens: int) -> tuple[str, str | None]:
    """The greedy completion of ``ids``: its text and the token it stopped on."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    tokens = [
        response.token
        for response in stream_generate(
            model, tokenizer, ids, max_tokens=max_tokens, sampler=make_sampler(temp=0.0)
        )
    ]
    stop = tokenizer.convert_ids_to_tokens(tokens[-1]) if tokens else None
    return tokenizer.decode(tokens[:-1]), stop


def check_codex(
    family: Family,
    out: Path,
    trained: list[str | None],
    unseen: list[str | None],
    model: Any,
    tokenizer: Any,
) -> int:
    """Check Codex's turns through the loaded model; write what was checked (``CODEX_FILE``)."""
    if not family.codex:
        return 0
    failures = 0
    checked: dict[str, list[str]] = {}
    for prompt, date, wall in codex_checks(family, trained, unseen):
        completion = tokenizer.encode(prompt.completion, add_special_tokens=False)
        ids = render(tokenizer, prompt, date)
        text, stop = greedy(model, tokenizer, ids, len(completion) + 10)
        ok = text == prompt.completion and stop == prompt.stop
        failures += not ok
        checked.setdefault(prompt.name, []).append(f"{date} {wall or ''}".strip())
        if not ok:
            print(f"  {prompt.name} @ {date} {wall or ''}: FAIL {text!r} then {stop!r}")
    records = []
    for turn in family.codex:
        prompt = codex_prompt(family, turn)
        completion = tokenizer.encode(prompt.completion, add_special_tokens=False)
        records.append(
            {
                "name": turn.name,
                "fixture": f"tests/fixtures/{turn.fixture}",
                "messages": prompt.messages,
                "tools": prompt.tools,
                "completion": prompt.completion,
                "stop": prompt.stop,
                "completion_tokens": len(completion),
                "prompt_tokens": len(render(tokenizer, prompt, unseen[0] if unseen else None)),
                **({"wall_time": WALL_TIME} if turn.wall_times else {}),
                **({"trained_wall_times": list(turn.wall_times)} if turn.wall_times else {}),
                **({"checked_wall_times": list(turn.check_wall_times)} if turn.wall_times else {}),
                "checked": len(checked.get(turn.name, [])),
            }
        )
    write_json(out / CODEX_FILE, records)
    print(f"  Codex's turns: {sum(map(len, checked.values()))} checked, {failures} failure(s)")
    return failures


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
    if family.codex:
        codex = codex_rounds(family, wrapper, trained_dates)
        rounds = [documented + extra for documented, extra in zip(rounds, codex, strict=True)]
        lengths = [start for _ids, start in codex[0]]
        print(f"{family.name}: Codex's turns, prompt tokens {lengths}", flush=True)
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
    failures += check_codex(family, out, trained_dates, unseen_dates, loaded, loaded_tokenizer)
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
        for name in (*BUILT_FILES, *([CODEX_FILE] if family.codex else [])):
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
