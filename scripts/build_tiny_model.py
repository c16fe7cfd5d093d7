"""Rebuild the bundled tiny model in ``src/engine/bundled/`` from nothing, deterministically.

What it writes: a Qwen3-architecture model of about 0.47M float32 parameters (``config.json``,
``model.safetensors``), a byte-level BPE tokenizer trained here on a fixed synthetic corpus
(``tokenizer.json``, ``tokenizer_config.json``), a Qwen3-style ChatML template
(``chat_template.jinja``) and ``prompts.json``: the documented prompts whose greedy completions the
weights reproduce exactly. The weights come from a seeded random init and a short full-batch Adam
run on those chats (loss on assistant tokens only), so the model memorises the answers; any other
prompt gets whatever the weights produce. It is also trained on Codex CLI's turns as the server
renders them (``scripts/codex_prompts.json``, made by ``scripts/codex_prompts.py`` from captured
requests), so that ``make conformance``'s Codex round trip works; what was checked of them is
written to ``codex_prompts.json``.

Determinism: fixed corpus, fixed seeds (``random``, ``mx.random``), fixed data order, a fixed
number of steps, and single-threaded tokenizer training. Running it twice on one machine gives
byte-identical files.

Run: ``make model`` (or ``.venv/bin/python scripts/build_tiny_model.py``). Everything is built
in a temporary folder and checked through ``mlx_lm.load`` there; only when every documented
prompt reproduces (and the logit margins are comfortable) are the files swapped into the output
folder. Otherwise it exits 1 and leaves the output folder as it was.
"""

from __future__ import annotations

import os

# Tokenizer training must not depend on thread scheduling.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
# OpenBLAS for MLX's CPU backend where it is installed, as the server loads it (src/blas.py:
# importing the package preloads it): Codex's long prompts train several times faster than on
# the reference BLAS. One thread, so every run adds in the same order.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import hashlib
import json
import random
import re
import shutil
import sys
import tempfile
import time
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
from fixture_training import (
    MaskedPrefixCache,
    adam_steps,
    bpe_trainer,
    byte_level_bpe,
    min_margin,
    warmup_cosine,
)

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "src" / "engine" / "bundled"
OUTPUT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "prompts.json",
    "codex_prompts.json",
)
# Codex CLI's turns as the server renders them (scripts/codex_prompts.py writes it from captured
# requests): trained on besides the documented prompts, kept out of the tokenizer corpus.
CODEX_SOURCE = ROOT / "scripts" / "codex_prompts.json"
# The follow-up's tool output starts with Codex's "Wall time: 0.0028 seconds" line, different on
# every run (digits are single tokens): trained with these values (the captured one is replaced),
# checked also with the unseen CODEX_CHECK_WALL_TIMES. All have the form d.dddd, so every variant
# has the same length.
CODEX_WALL_TIMES = (
    "0.0119",
    "0.0034",
    "0.0258",
    "0.0571",
    "0.1042",
    "0.0007",
    "0.0463",
    "0.0890",
    "0.2316",
    "0.0075",
)
CODEX_CHECK_WALL_TIMES = ("0.0028", "0.0021", "0.0156", "0.0735", "0.3389", "1.0402")

SEED = 20240601
TRAIN_STEPS = 200
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
# Smallest accepted logit gap between each expected token and the runner-up.
MIN_MARGIN = 2.0

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special: they must survive `decode(..., skip_special_tokens=True)` and streaming
# detokenization, because the server parses them out of the generated text.
MARKUP_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
BPE_VOCAB_SIZE = 4096

MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    # vocab_size, bos/eos/pad ids are filled in from the trained tokenizer.
}

# A Qwen3-style ChatML template. Differences from Qwen3's own: `developer` renders like
# `system`; content may be a list of text parts; reasoning_content is rendered whenever it is
# non-empty (not only after the last user query), so a replayed history keeps its prefix; each
# tool is rendered in one canonical form, `{"type": "function", "function": {"name",
# "description", "parameters"}}`, whether it was given nested (Chat Completions) or flat
# (Responses), and other keys such as `strict` are left out, so the prompt does not depend on
# how the server spells tools.
# "tool_call.name" together with "<tool_call>" is what makes mlx-lm pick its json_tools parser.
CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.text is defined and part.text is string -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
    {%- set system_message = render_content(messages[0].content) -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system_message = none -%}
    {%- set rest = messages -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if system_message -%}
        {{- system_message + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {%- set fn = tool.function if tool.function is defined else tool -%}
        {{- '\n{"type": "function", "function": {"name": ' + (fn.name | tojson) -}}
        {%- if fn.description is defined and fn.description is not none -%}
            {{- ', "description": ' + (fn.description | tojson) -}}
        {%- endif -%}
        {%- if fn.parameters is defined and fn.parameters is not none -%}
            {{- ', "parameters": ' + (fn.parameters | tojson) -}}
        {%- endif -%}
        {{- '}}' -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system_message is not none -%}
    {{- '<|im_start|>system\n' + system_message + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in rest -%}
    {%- set content = render_content(message.content) -%}
    {%- if message.role in ['user', 'system', 'developer'] -%}
        {%- set role = 'system' if message.role == 'developer' else message.role -%}
        {{- '<|im_start|>' + role + '\n' + content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set reasoning_content = '' -%}
        {%- if message.reasoning_content is defined and message.reasoning_content is string -%}
            {%- set reasoning_content = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {%- set reasoning_content = reasoning_content.strip('\n') -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if reasoning_content -%}
            {{- '<think>\n' + reasoning_content + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- content -}}
        {%- endif -%}
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- if (loop.first and content) or (not loop.first) -%}
                    {{- '\n' -}}
                {%- endif -%}
                {%- if tool_call.function -%}
                    {%- set tool_call = tool_call.function -%}
                {%- endif -%}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments -}}
                {%- else -%}
                    {{- tool_call.arguments | tojson -}}
                {%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or (rest[loop.index0 - 1].role != 'tool') -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
        {%- if loop.last or (rest[loop.index0 + 1].role != 'tool') -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The name of the city."}},
            "required": ["city"],
        },
    },
}

COUNT_TO = 110
COUNT_TEXT = " ".join(str(i) for i in range(1, COUNT_TO + 1))

# The documented prompts: (name, messages, tools, expected greedy completion).
PROMPTS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, str]] = [
    ("hello", [{"role": "user", "content": "Reply with: hello"}], None, "hello"),
    (
        "hello_with_system",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Reply with: hello"},
        ],
        None,
        "hello",
    ),
    ("goodbye", [{"role": "user", "content": "Reply with: goodbye"}], None, "goodbye"),
    (
        "short",
        [{"role": "user", "content": "Say something short."}],
        None,
        "The sky is blue.",
    ),
    (
        "colors",
        [{"role": "user", "content": "Name three colors."}],
        None,
        "Red, green and blue.",
    ),
    (
        "capital",
        [{"role": "user", "content": "What is the capital of France?"}],
        None,
        "The capital of France is Paris.",
    ),
    ("yes", [{"role": "user", "content": "Say yes."}], None, "yes"),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Reply with: hello"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "Reply with: goodbye"},
        ],
        None,
        "goodbye",
    ),
    (
        "think",
        [{"role": "user", "content": "Think, then answer: what is 2 + 2?"}],
        None,
        "<think>\n2 plus 2 makes 4.\n</think>\n\nThe answer is 4.",
    ),
    (
        "json_cat",
        [{"role": "user", "content": "Give me a JSON object describing a cat."}],
        None,
        '{"name": "Tom", "animal": "cat", "age": 3}',
    ),
    (
        "tool_call",
        [{"role": "user", "content": "What is the weather in Paris?"}],
        [WEATHER_TOOL],
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    (
        "tool_result",
        [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": '{"city": "Paris", "temperature": 18, "condition": "sunny"}',
            },
        ],
        [WEATHER_TOOL],
        "It is sunny and 18 degrees in Paris.",
    ),
    (
        "count",
        [{"role": "user", "content": f"Count from 1 to {COUNT_TO}."}],
        None,
        COUNT_TEXT,
    ),
]
LONG_PROMPT = "count"

# Extra text for the tokenizer only, so that ordinary English does not fall back to single bytes.
TOKENIZER_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model lives in this folder so that the
server and its tests always have a real model to run, without a network and without a GPU.
It was trained for a few minutes on a handful of chats and knows nothing else: ask it anything
else and it will answer with whatever its weights happen to produce.
You are a helpful assistant. Answer the question as briefly as you can. The user asked about
the weather, the time, the date, a city, a country, a number, a list, a name, or a story.
What is the capital of France? Paris is the capital of France. What is the weather like today?
It is sunny and warm in the morning, cloudy in the afternoon and cold at night. Rain is likely
tomorrow. The temperature is 18 degrees. The wind is light.
Write a short poem. Summarize the following text. Translate this sentence. Explain why the sky
is blue. Tell me a joke. Give me a list of three things. Name a color, an animal and a number.
One, two, three, four, five, six, seven, eight, nine, ten. Yes. No. Maybe. Thank you. Hello,
world! Goodbye, and good luck. Please call the function with the right arguments.
The response is a JSON object with a name, a type, a value and a list of items. The function
returns the result as a string. Use the tool to look up the answer, then reply to the user.
Think step by step, then give the final answer. First, second, third, finally, because, so,
therefore, however, although, while, when, where, which, who, what, why, how.
Red, green, blue, yellow, black, white, orange, purple. Cat, dog, bird, fish, horse, cow.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. January, February, March,
April, May, June, July, August, September, October, November, December.
def main(): return {"status": "ok", "items": [1, 2, 3], "error": null, "done": true}
"""


# --- tokenizer ------------------------------------------------------------------------------


def tokenizer_corpus() -> list[str]:
    """The fixed texts the BPE merges are learned from (markup tokens removed)."""
    texts = [*TOKENIZER_CORPUS.splitlines()]
    for _name, messages, tools, expected in PROMPTS:
        for message in messages:
            if isinstance(message.get("content"), str):
                texts.append(message["content"])
        if tools:
            texts.extend(json.dumps(tool, ensure_ascii=False) for tool in tools)
        texts.append(expected)
    texts.append(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within XML tags:\n"
        "For each function call, return a json object with function name and arguments within "
        'XML tags:\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    )
    markup = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + MARKUP_TOKENS))
    return [markup.sub("\n", text) for text in texts]


def build_tokenizer() -> Tokenizer:
    tokenizer = byte_level_bpe()
    trainer = bpe_trainer(BPE_VOCAB_SIZE, SPECIAL_TOKENS)
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": MODEL_CONFIG["max_position_embeddings"],
        "split_special_tokens": False,
    }


# --- training -------------------------------------------------------------------------------


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def seed_everything() -> None:
    random.seed(SEED)
    mx.random.seed(SEED)


Example = tuple[list[int], int]  # token ids, index of the first completion token
Masked = tuple[list[int], list[bool]]  # token ids, which of them are trained targets


def shared_prefix(sequences: list[Masked]) -> tuple[int, mx.array, mx.array, mx.array, mx.array]:
    """Split sequences of one length that share a prefix: (prefix length, prefix ids, prefix
    target mask, suffix ids (batch, length), suffix target masks). The prefix's targets must be
    the same in every sequence, and the suffixes' first tokens are not targets."""
    first = sequences[0][0]
    assert all(len(ids) == len(first) for ids, _ in sequences), "suffixes of unequal length"
    n = next(
        (i for i in range(len(first)) if any(ids[i] != first[i] for ids, _ in sequences)),
        len(first) - 1,
    )
    assert all(mask[: n + 1] == sequences[0][1][: n + 1] for _, mask in sequences)
    assert not sequences[0][1][n], "a suffix must not start with a target"
    return (
        n,
        mx.array(first[:n]),
        mx.array(sequences[0][1][1:n]),
        mx.array([ids[n:] for ids, _ in sequences]),
        mx.array([mask[n + 1 :] for _, mask in sequences]),
    )


def train(
    model: nn.Module, examples: list[Example], groups: list[list[Masked]], steps: int
) -> float:
    """Full-batch Adam on every example each step; loss on the completion tokens only.

    ``examples`` are run one by one. Each of ``groups`` is a set of long sequences sharing a
    prefix (Codex's follow-up under several wall times, the first turn's answer inside the
    shared prefix): the prefix runs once per step, the suffixes as one batch after it. The loss
    is the same sum as running every sequence on its own, for a fraction of the cost.
    """
    inputs = [mx.array(ids[:-1]) for ids, _ in examples]
    targets = [mx.array(ids[1:]) for ids, _ in examples]
    masks = [mx.arange(len(ids) - 1) >= (start - 1) for ids, start in examples]
    shared = [shared_prefix(group) for group in groups]
    total = sum(len(ids) - start for ids, start in examples)
    total += sum(int(pm.sum().item()) + int(sm.sum().item()) for _n, _p, pm, _s, sm in shared)

    def loss_fn(m: nn.Module, _step: int) -> mx.array:
        loss = mx.array(0.0)
        for x, y, mask in zip(inputs, targets, masks, strict=True):
            logits = m(x[None])[0]
            ce = nn.losses.cross_entropy(logits, y, reduction="none")
            loss = loss + (ce * mask).sum()
        for _n, prefix, prefix_mask, suffixes, suffix_masks in shared:
            cache = [MaskedPrefixCache() for _ in m.layers]
            logits = m(prefix[None], cache=cache)[0][:-1]
            ce = nn.losses.cross_entropy(logits, prefix[1:], reduction="none")
            loss = loss + (ce * prefix_mask).sum()
            logits = m(suffixes, cache=cache)[:, :-1]
            ce = nn.losses.cross_entropy(logits, suffixes[:, 1:], reduction="none")
            loss = loss + (ce * suffix_masks).sum()
        return loss / total

    schedule = warmup_cosine(LEARNING_RATE, WARMUP_STEPS, steps)
    return adam_steps(model, loss_fn, steps, schedule, report_every=10)


# --- main -----------------------------------------------------------------------------------


def codex_turns() -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], str, str | None]]:
    """Codex's turns to check: (name, messages, tools, expected, wall time or None): the first
    turn, the one-turn prompt, the follow-up under every trained and every unseen wall time."""
    source = {p["name"]: p for p in json.loads(CODEX_SOURCE.read_text(encoding="utf-8"))}
    turns: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], str, str | None]] = []
    for name in ("codex_mcp_call", "codex_hello"):
        turn = source[name]
        turns.append((name, turn["messages"], turn["tools"], turn["expected"], None))
    answer = source["codex_mcp_answer"]
    fixture_line = f"Wall time: {answer['wall_time']} seconds"
    for wall_time in CODEX_WALL_TIMES + CODEX_CHECK_WALL_TIMES:
        messages = json.loads(json.dumps(answer["messages"]))
        assert fixture_line in messages[-1]["content"], "no wall-time line in the tool output"
        line = f"Wall time: {wall_time} seconds"
        messages[-1]["content"] = messages[-1]["content"].replace(fixture_line, line)
        name = f"codex_mcp_answer@{wall_time}"
        turns.append((name, messages, answer["tools"], answer["expected"], wall_time))
    return turns


def build(out: Path, steps: int) -> int:
    """Write every output file into ``out`` (an empty folder); return the number of failures."""
    # Imported here: mlx-lm pulls in transformers, which is slow to import.
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.models import qwen3
    from mlx_lm.sample_utils import make_sampler
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    started = time.perf_counter()
    seed_everything()
    tok = build_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config())
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    vocab = tok.get_vocab_size(with_added_tokens=True)

    config = dict(MODEL_CONFIG)
    config["vocab_size"] = vocab
    config["bos_token_id"] = tok.token_to_id("<|endoftext|>")
    config["eos_token_id"] = tok.token_to_id("<|im_end|>")
    config["pad_token_id"] = tok.token_to_id("<|endoftext|>")
    write_json(out / "config.json", dict(sorted(config.items())))

    # Render prompts exactly as mlx-lm (and so the server) will.
    wrapper = load_tokenizer(out)
    im_end = tok.token_to_id("<|im_end|>")
    examples: list[tuple[list[int], int]] = []
    for _name, messages, tools, expected in PROMPTS:
        prompt_ids = list(
            wrapper.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        )
        completion = wrapper.encode(expected, add_special_tokens=False)
        assert wrapper.decode(completion) == expected, expected
        examples.append((prompt_ids + completion + [im_end], len(prompt_ids)))

    # Codex's turns, rendered the same way. The first turn (the MCP call) is the start of every
    # follow-up: it is trained there, inside the follow-ups' shared prefix (its answer tokens are
    # targets). The follow-ups under the trained wall times form one shared-prefix group; the
    # one-turn prompt is an ordinary example. The unseen wall times are only checked.
    codex = codex_turns()
    codex_examples: list[Example] = []
    for _name, messages, tools, expected, _wall in codex:
        prompt_ids = list(
            wrapper.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        )
        completion = wrapper.encode(expected, add_special_tokens=False)
        assert wrapper.decode(completion) == expected, expected
        codex_examples.append((prompt_ids + completion + [im_end], len(prompt_ids)))
    call_ids, call_start = codex_examples[0]
    group: list[Masked] = []
    for (_name, _m, _t, _e, wall), (ids, start) in zip(codex, codex_examples, strict=True):
        if wall in CODEX_WALL_TIMES:
            assert ids[: len(call_ids)] == call_ids, "the follow-up does not replay the call"
            mask = [call_start <= i < len(call_ids) or i >= start for i in range(len(ids))]
            group.append((ids, mask))
    examples_trained = [*examples, codex_examples[1]]
    print(
        f"codex: first turn {call_start} prompt tokens, follow-up {codex_examples[2][1]}, "
        f"one-turn {codex_examples[1][1]}; {len(group)} wall times trained",
        flush=True,
    )

    seed_everything()
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"vocab {vocab}, params {n_params:,}, training {steps} steps", flush=True)
    t_train = time.perf_counter()
    final_loss = train(model, examples_trained, [group], steps)
    train_s = time.perf_counter() - t_train
    margin = min_margin(model, examples)
    trained = [
        ex
        for turn, ex in zip(codex, codex_examples, strict=True)
        if turn[4] is None or turn[4] in CODEX_WALL_TIMES
    ]
    unseen = [
        ex
        for turn, ex in zip(codex, codex_examples, strict=True)
        if turn[4] in CODEX_CHECK_WALL_TIMES
    ]
    codex_margin = min_margin(model, trained)
    unseen_margin = min_margin(model, unseen)

    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})

    # Check through mlx-lm's normal loading path, as the server will run it.
    loaded, tokenizer = load(str(out))
    sampler = make_sampler(temp=0.0)
    records: list[dict[str, Any]] = []
    failures = 0
    print(f"{'prompt':<20} {'tokens':>6}  result")

    def greedy(messages: Any, tools: Any, max_tokens: int) -> str:
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        return "".join(
            r.text
            for r in stream_generate(
                loaded, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler
            )
        )

    for (name, messages, tools, expected), (ids, start) in zip(PROMPTS, examples, strict=True):
        expected_tokens = len(ids) - start - 1
        text = greedy(messages, tools, expected_tokens + 20)
        ok = text == expected
        failures += not ok
        print(f"{name:<20} {expected_tokens:>6}  {'pass' if ok else 'FAIL: ' + repr(text[:80])}")
        records.append(
            {
                "name": name,
                "messages": messages,
                "tools": tools,
                "expected": expected,
                "expected_tokens": expected_tokens,
            }
        )
    write_json(out / "prompts.json", records)
    prompt_failures = failures

    codex_records: list[dict[str, Any]] = []
    for (name, messages, tools, expected, wall), (ids, start) in zip(
        codex, codex_examples, strict=True
    ):
        expected_tokens = len(ids) - start - 1
        text = greedy(messages, tools, expected_tokens + 20)
        ok = text == expected
        failures += not ok
        status = "pass" if ok else "FAIL: " + repr(text[:80])
        print(f"{name:<24} {start:>5}+{expected_tokens:<3} {status}")
        record: dict[str, Any] = {"name": name, "messages": messages, "tools": tools}
        record.update(expected=expected, expected_tokens=expected_tokens, prompt_tokens=start)
        if wall is not None:
            record.update(wall_time=wall, trained=wall in CODEX_WALL_TIMES)
        codex_records.append(record)
    write_json(out / "codex_prompts.json", codex_records)

    long_tokens = next(r["expected_tokens"] for r in records if r["name"] == LONG_PROMPT)
    if long_tokens <= 300:
        print(f"prompt {LONG_PROMPT!r} has only {long_tokens} tokens (need > 300)")
        failures += 1
    # A thin margin could flip under another backend's rounding (Metal, batching, caching).
    if margin < MIN_MARGIN:
        print(f"min logit margin {margin:.2f} is below {MIN_MARGIN}: train longer")
        failures += 1
    if codex_margin < MIN_MARGIN:
        print(f"Codex's min logit margin {codex_margin:.2f} is below {MIN_MARGIN}: train longer")
        failures += 1
    if not (tokenizer.has_tool_calling and tokenizer.has_thinking):
        print("mlx-lm did not detect tool calling and thinking from the files")
        failures += 1

    size = sum((out / name).stat().st_size for name in OUTPUT_FILES)
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    print(
        f"params {n_params:,}  vocab {vocab}  final loss {final_loss:.6f}  "
        f"min logit margin {margin:.2f}, Codex's {codex_margin:.2f} "
        f"(unseen wall times {unseen_margin:.2f})\n"
        f"tool calling: {tokenizer.has_tool_calling} ({tokenizer.tool_call_start!r}), "
        f"thinking: {tokenizer.has_thinking} ({tokenizer.think_start!r})\n"
        f"files {size / 1e6:.2f} MB  model.safetensors sha256 {digest}\n"
        f"training {train_s:.1f} s, total {time.perf_counter() - started:.1f} s  "
        f"{len(records) - prompt_failures}/{len(records)} prompts pass, "
        f"{len(codex_records)} Codex prompts checked, "
        f"{failures} failure(s) in all"
    )
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    parser.add_argument("--steps", type=int, default=TRAIN_STEPS, help="training steps")
    parser.add_argument(
        "--keep", type=Path, default=None, help="also copy the built files here, pass or fail"
    )
    args = parser.parse_args()
    out: Path = args.out

    # Built aside, then swapped in file by file: the output folder always holds a complete,
    # passing model (a server or an editable install may be reading it meanwhile).
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as tmp:
        failures = build(Path(tmp), args.steps)
        if args.keep is not None:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
        if failures:
            print(f"not written to {out}")
            return 1
        out.mkdir(parents=True, exist_ok=True)
        for name in OUTPUT_FILES:
            partial = out / f".{name}.partial"
            shutil.copyfile(Path(tmp) / name, partial)
            os.replace(partial, out / name)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
