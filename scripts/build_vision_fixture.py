"""Build the tiny vision-language fixture in ``tests/fixtures/vision/qwen2-vl/``, deterministically.

What it writes: a Qwen2-VL model (mlx-vlm's own ``qwen2_vl`` architecture: a ViT vision tower with
a 3-D patch embedding and a patch merger, and a Qwen2 language model with multimodal RoPE) of
about 0.7M float32 parameters (``config.json``, ``model.safetensors``); the bundled model's
byte-level BPE tokenizer plus Qwen2-VL's vision marker tokens, special as in the real tokenizer
(``tokenizer.json``, ``tokenizer_config.json``); Qwen2-VL-Instruct's real chat template and image
processor config (``chat_template.jinja``, ``preprocessor_config.json``: committed data, never
written here, their source named in ``docs/vision.md``) and ``prompts.json``: the documented
prompts, each with its image (a solid square of one colour, described by colour and side, or
llm-comply's test photo), whose greedy answers mlx-vlm's own ``generate`` reproduces.

Behaviour it is trained for: "What colour is the square?" (and a few rewordings, with the image
before or after the text) answers ``red``, ``green`` or ``blue`` for a square of that colour, of
any side from 56 to 112 pixels and shades near the pure colour; "Describe this image briefly."
answers "A red square." (and so on for each colour) and, for llm-comply's photo of four dice (the Open
Responses suite's ``image-input`` test), "Four dice: red, green, blue and yellow."; "Count from 1
to 20." answers the count, with or without a square (bench/vision.py's long answer); the square's
colour is also answered on a later turn: after a ``view_image`` tool call whose output is the
image (Codex's shape, rendered as the server replays it: an empty assistant turn, then a ``tool``
turn holding the image), and when asked again after the first turn's answer (a
``previous_response_id`` chain); the
bundled model's plain text prompts (``Reply with: hello`` ...) answer as the bundled model does. As the bundled model
(``scripts/build_tiny_model.py``): a seeded random init, then full-batch Adam with the loss on
the answer tokens only. ``--untrained`` writes the random init (loadable, answers nothing
useful) and skips the answer check.

Run: ``.venv/bin/python scripts/build_vision_fixture.py`` (10 to 16 minutes on 2 busy CPU cores). It is
built in a temporary folder and checked through ``mlx_vlm.load`` and ``mlx_vlm.generate`` there;
only when every documented prompt reproduces are the files copied into place. Same machine, same
files: fixed corpus, seeds, data order and step count.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import io
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# isort: off
import mlx_responses  # noqa: F401  (importing it preloads OpenBLAS: before MLX)

# isort: on
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from PIL import Image
from tokenizers import AddedToken, Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_training import adam_steps, warmup_cosine

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "src" / "engine" / "bundled"
OUT_DIR = ROOT / "tests" / "fixtures" / "vision" / "qwen2-vl"
# Committed data (their sources are named in docs/vision.md); copied into the build folder.
DATA_FILES = ("chat_template.jinja", "preprocessor_config.json")
WRITTEN_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "prompts.json",
)

SEED = 20261202
TRAIN_STEPS = 160
LEARNING_RATE = 3e-3
WARMUP_STEPS = 8
# Smallest accepted logit gap between each answer token and the runner-up (the last build: 0.50,
# on "Name three colors."; float32 differences between mlx-vlm, the server and batching are ~1e-4).
MIN_MARGIN = 0.25

# Qwen2-VL's marker tokens, special in the real tokenizer: the processor expands one
# <|image_pad|> into one token per merged 28x28 patch, framed by <|vision_start|>/<|vision_end|>.
VISION_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
}
# Shades trained besides the pure colour, so that a JPEG's or a resize's error changes nothing.
SHADES: dict[str, list[tuple[int, int, int]]] = {
    "red": [(220, 20, 30), (200, 40, 40)],
    "green": [(30, 200, 40), (0, 128, 0)],
    "blue": [(20, 40, 220), (40, 60, 180)],
}
TRAIN_SIDES = (56, 84, 112)
DOCUMENTED_PROMPT = "What colour is the square?"
REWORDINGS = ("What color is the square?", "Which colour is this square?")
# The bundled model's plain prompts that the fixture also answers (src/engine/bundled/prompts.json).
TEXT_PROMPTS = (
    "hello",
    "hello_with_system",
    "goodbye",
    "short",
    "colors",
    "capital",
    "yes",
    "multi_turn",
)
# A long answer, with and without an image: bench/vision.py decodes it to measure throughput.
COUNT_PROMPT = "Count from 1 to 20."
COUNT_ANSWER = " ".join(str(i) for i in range(1, 21))
# Its tokens weigh this much more than the short answers' in the loss: the hardest to learn.
COUNT_WEIGHT = 3.0
# The Open Responses suite's image-input test (llm-comply, `make conformance`) sends this with its
# own photo of four dice; its anthropic twin requires the answer to end (stop_reason end_turn).
DESCRIBE_PROMPT = "Describe this image briefly."
DICE_ANSWER = "Four dice: red, green, blue and yellow."
# Codex's view_image shape: the model called a tool whose output is the image (a tool
# turn; the template renders no tool calls, so the call is an empty assistant turn), then answers
# the colour, on that turn or after the user's next question.
TOOL_ASKS = (
    "What colour is the square in square.png?",
    "Look at square.png and tell me its colour.",
)
LOOK = "Look at the picture."
# A previous_response_id chain: the image answered, then asked about again in a text turn.
FOLLOW_UPS = ("What colour was the square?", "And again: " + DOCUMENTED_PROMPT, DOCUMENTED_PROMPT)
# side -1 marks that photo (llm-comply's specs/test_image.jpg, 400x300) in place of a square.
PHOTO = -1


@dataclass(frozen=True, slots=True)
class Prompt:
    name: str
    messages: list[dict[str, Any]]
    colour: str | None  # the square's colour, None for a text prompt
    rgb: tuple[int, int, int] | None
    side: int
    expected: str
    # The tools the template is given (scripts/build_qwen3_vl_fixture.py's Codex turns).
    tools: list[dict[str, Any]] | None = None


def square(rgb: tuple[int, int, int], side: int) -> Image.Image:
    return Image.new("RGB", (side, side), rgb)


def photo() -> Image.Image:
    """llm-comply's test photo, from the installed package (pinned in the test extras)."""
    from importlib.resources import files

    data = (files("llm_comply") / "specs" / "test_image.jpg").read_bytes()
    return Image.open(io.BytesIO(data)).convert("RGB")


def image_of(prompt: Prompt) -> Image.Image:
    assert prompt.rgb is not None
    return photo() if prompt.side == PHOTO else square(prompt.rgb, prompt.side)


def image_turn(text: str, image_first: bool) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image"}, {"type": "text", "text": text}]
    if not image_first:
        parts.reverse()
    return [{"role": "user", "content": parts}]


def view_image_call() -> dict[str, Any]:
    """The assistant turn that called view_image, as the server replays a function_call."""
    call = {"name": "view_image", "arguments": {"path": "square.png"}}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
    }


def tool_turns(ask: str, then: str | None) -> list[dict[str, Any]]:
    """``ask``, the view_image call, its output (the image), and ``then`` asked after it."""
    output = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "image"}]}
    turns = [{"role": "user", "content": ask}, view_image_call(), output]
    return turns + ([] if then is None else [{"role": "user", "content": then}])


def chain_turns(colour: str, follow_up: str) -> list[dict[str, Any]]:
    """The image asked about and answered, then ``follow_up`` (a previous_response_id chain)."""
    first = image_turn(DOCUMENTED_PROMPT, True)
    return [
        *first,
        {"role": "assistant", "content": colour},
        {"role": "user", "content": follow_up},
    ]


def later_turns(colour: str, rgb: tuple[int, int, int], side: int, name: str) -> list[Prompt]:
    """The image in a tool's output and in an earlier turn of a chain: each answers ``colour``."""
    shapes = [(tool_turns(a, None), f"tool_output_{i}") for i, a in enumerate(TOOL_ASKS)]
    shapes.append((tool_turns(LOOK, DOCUMENTED_PROMPT), "tool_output_then_question"))
    shapes += [(chain_turns(colour, f), f"follow_up_{i}") for i, f in enumerate(FOLLOW_UPS)]
    return [Prompt(f"{name}_{label}", m, colour, rgb, side, colour) for m, label in shapes]


def text_prompts() -> list[Prompt]:
    bundled = {p["name"]: p for p in json.loads((BUNDLED / "prompts.json").read_text())}
    return [
        Prompt(name, bundled[name]["messages"], None, None, 0, bundled[name]["expected"])
        for name in TEXT_PROMPTS
    ]


def documented_prompts() -> list[Prompt]:
    """What prompts.json promises: the documented prompt, each colour, image first and last."""
    out = []
    for colour, rgb in COLOURS.items():
        for image_first in (True, False):
            where = "image_first" if image_first else "text_first"
            out.append(
                Prompt(
                    f"{colour}_{where}",
                    image_turn(DOCUMENTED_PROMPT, image_first),
                    colour,
                    rgb,
                    84,
                    colour,
                )
            )
    later = [
        p
        for colour, rgb in COLOURS.items()
        for p in later_turns(colour, rgb, 84, colour)
        if p.name.endswith(("tool_output_0", "question", "follow_up_0", "follow_up_1"))
    ]
    return out + text_prompts() + count_with_image() + described() + later


def described() -> list[Prompt]:
    """The describe prompt on llm-comply's photo and on a square, text first as the suite sends."""
    return [
        Prompt(
            "describe_photo",
            image_turn(DESCRIBE_PROMPT, False),
            None,
            (0, 0, 0),
            PHOTO,
            DICE_ANSWER,
        ),
        Prompt(
            "describe_red_square",
            image_turn(DESCRIBE_PROMPT, False),
            "red",
            COLOURS["red"],
            84,
            "A red square.",
        ),
    ]


def count_with_image() -> list[Prompt]:
    """The count prompt alone and after a square of each colour (bench/vision.py's streams)."""
    alone = [{"role": "user", "content": COUNT_PROMPT}]
    return [Prompt("count", alone, None, None, 0, COUNT_ANSWER)] + [
        Prompt(f"count_{c}_square", image_turn(COUNT_PROMPT, True), c, rgb, 56, COUNT_ANSWER)
        for c, rgb in COLOURS.items()
    ]


def training_prompts() -> list[Prompt]:
    out = []
    for colour, rgb in COLOURS.items():
        for shade in [rgb, *SHADES[colour]]:
            for side in TRAIN_SIDES:
                for text in (DOCUMENTED_PROMPT, *REWORDINGS):
                    for image_first in (True, False):
                        out.append(
                            Prompt(
                                "train", image_turn(text, image_first), colour, shade, side, colour
                            )
                        )
    for colour, rgb in COLOURS.items():
        for shade in [rgb, SHADES[colour][0]]:
            for side in TRAIN_SIDES:
                out += later_turns(colour, shade, side, "train")
    for image_first in (True, False):
        turn = image_turn(DESCRIBE_PROMPT, image_first)
        out.append(Prompt("train", turn, None, (0, 0, 0), PHOTO, DICE_ANSWER))
        for colour, rgb in COLOURS.items():
            for side in TRAIN_SIDES[:2]:
                out.append(Prompt("train", turn, colour, rgb, side, f"A {colour} square."))
    return out + text_prompts() + count_with_image()


# Checked besides the documented prompts: sides and shades never trained on.
def held_out_prompts() -> list[Prompt]:
    shades = {"red": (240, 10, 10), "green": (10, 180, 20), "blue": (10, 20, 240)}
    return [
        Prompt(f"{c}_held_out", image_turn(DOCUMENTED_PROMPT, i % 2 == 0), c, shades[c], side, c)
        for i, (c, side) in enumerate([("red", 70), ("green", 105), ("blue", 98)])
    ]


def write_tokenizer(out: Path) -> int:
    tokenizer = Tokenizer.from_file(str(BUNDLED / "tokenizer.json"))
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS]
    )
    tokenizer.save(str(out / "tokenizer.json"))
    config = json.loads((BUNDLED / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return int(tokenizer.get_vocab_size())


def model_config(tokenizer: Tokenizer) -> dict[str, Any]:
    ids = {t: tokenizer.token_to_id(t) for t in [*VISION_TOKENS, "<|endoftext|>", "<|im_end|>"]}
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        # head_dim 32: its 16 rotary frequencies split over (time, height, width) as Qwen2-VL's
        # [16, 24, 24] splits 64.
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "torch_dtype": "float32",
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": 128,  # the merger's output: the language model's width
            "num_heads": 4,
            "mlp_ratio": 2,
            "in_channels": 3,
            "patch_size": 14,
            "spatial_patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }


def make_model(config: dict[str, Any]) -> nn.Module:
    from mlx_vlm.models.qwen2_vl import Model, ModelConfig, TextConfig, VisionConfig

    cfg = ModelConfig.from_dict(dict(config))
    cfg.text_config = TextConfig.from_dict(cfg.text_config)
    cfg.vision_config = VisionConfig.from_dict(cfg.vision_config)
    mx.random.seed(SEED)
    model = Model(cfg)
    mx.eval(model.parameters())
    return model


@dataclass(frozen=True, slots=True)
class Example:
    """Prompts encoded as the processor encodes them, each followed by its answer and
    <|im_end|>, padded at the end to one width (causal attention: the padding changes nothing
    before it)."""

    ids: mx.array  # (B, L)
    mask: mx.array  # (B, L): 1 where ids[b, j] is an answer token (predicted from j - 1)
    pixel_values: mx.array | None
    grid_thw: mx.array | None
    # Worked out once, as mlx-vlm's get_input_embeddings does at every call (in Python loops
    # that would dominate a training step): the multimodal RoPE positions, and for each token
    # the row of the vision tower's output that replaces its embedding (where is_image).
    position_ids: mx.array
    feature_index: mx.array | None  # (B, L) int32
    is_image: mx.array | None  # (B, L, 1) bool


def encode(model: Any, processor: Any, prompts: list[Prompt]) -> Example:
    """One batch: prompts of one image side (the vision tower's outputs concatenate)."""
    tokenizer = processor.tokenizer
    texts = [
        tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    images = [image_of(p) for p in prompts if p.rgb is not None]
    if images:
        assert len(images) == len(prompts)
        inputs = processor(text=texts, images=images, padding=True)
        masks = inputs["attention_mask"].tolist()
        rows = [
            [int(i) for i, keep in zip(row, m, strict=True) if keep]
            for row, m in zip(inputs["input_ids"].tolist(), masks, strict=True)
        ]
        pixel_values, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    else:
        rows = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        pixel_values = grid = None
    answers = [
        tokenizer.encode(p.expected + "<|im_end|>", add_special_tokens=False) for p in prompts
    ]
    width = max(len(r) + len(a) for r, a in zip(rows, answers, strict=True))
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids, mask = [], []
    for p, r, a in zip(prompts, rows, answers, strict=True):
        fill = width - len(r) - len(a)
        ids.append(r + a + [pad] * fill)
        weight = COUNT_WEIGHT if p.expected == COUNT_ANSWER else 1.0
        mask.append([0.0] * len(r) + [weight] * len(a) + [0.0] * fill)
    ids_array = mx.array(ids)
    # Passed explicitly: the language model otherwise reuses the positions of its last image.
    positions, _ = model.language_model.get_rope_index(ids_array, grid, None, None)
    if grid is None:
        return Example(ids_array, mx.array(mask), None, None, positions, None, None)
    image_token = model.config.image_token_id
    index, flags, offset = [], [], 0
    for row in ids:
        k = 0
        index.append([])
        flags.append([])
        for token in row:
            index[-1].append(offset + k if token == image_token else 0)
            flags[-1].append(token == image_token)
            k += token == image_token
        offset += k
    return Example(
        ids_array,
        mx.array(mask),
        pixel_values,
        grid,
        positions,
        mx.array(index, dtype=mx.int32),
        mx.array(flags)[..., None],
    )


def batches(model: Any, processor: Any, prompts: list[Prompt]) -> list[Example]:
    """One batch per image side (text prompts: side 0), the long count answers apart (short
    rows padded to their width would cost as much), in a fixed order."""
    groups: dict[tuple[int, bool], list[Prompt]] = {}
    for p in prompts:
        groups.setdefault((p.side, len(p.expected) > 100), []).append(p)
    return [encode(model, processor, groups[key]) for key in sorted(groups)]


def logits_of(model: Any, ex: Example) -> mx.array:
    embeds = model.language_model.model.embed_tokens(ex.ids)
    if ex.pixel_values is not None:
        features = model.vision_tower(ex.pixel_values, ex.grid_thw)
        embeds = mx.where(ex.is_image, features[ex.feature_index], embeds)
    out = model.language_model(ex.ids, embeds, position_ids=ex.position_ids)
    return out.logits  # type: ignore[no-any-return]


def answer_loss(logits: mx.array, ids: mx.array, mask: mx.array) -> mx.array:
    """The summed cross-entropy of the answer tokens (where ``mask``) of ``ids``."""
    losses = nn.losses.cross_entropy(logits[:, :-1], ids[:, 1:])
    return (losses * mask[:, 1:]).sum()


def train(
    model: nn.Module,
    data: list[Any],
    steps: int,
    loss_of: Any = None,
    learning_rate: float = LEARNING_RATE,
) -> float:
    """Full-batch Adam on ``data``, the loss averaged over its answer tokens (``ex.mask``);
    ``loss_of(model, ex)`` gives one batch's summed loss (scripts/build_qwen3_vl_fixture.py
    passes its own)."""
    tokens = sum(ex.mask.sum().item() for ex in data)

    def batch_loss(m: nn.Module, ex: Example) -> mx.array:
        return answer_loss(logits_of(m, ex), ex.ids, ex.mask)

    per_batch = batch_loss if loss_of is None else loss_of

    def loss_fn(m: nn.Module, _step: int) -> mx.array:
        total = mx.array(0.0)
        for ex in data:
            total = total + per_batch(m, ex)
        return total / tokens

    schedule = warmup_cosine(learning_rate, WARMUP_STEPS, steps, fraction_first=False)
    return adam_steps(model, loss_fn, steps, schedule, report_every=10)


def min_margin(model: Any, data: list[Any], forward: Any = None) -> float:
    """The smallest gap, over every answer token, between its logit and the runner-up's."""
    worst = math.inf
    for number, ex in enumerate(data):
        logits = (logits_of if forward is None else forward)(model, ex)[:, :-1]
        target = ex.ids[:, 1:]
        right = mx.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
        others = mx.where(mx.arange(logits.shape[-1]) == target[..., None], -mx.inf, logits)
        gap = mx.where(ex.mask[:, 1:] > 0, right - others.max(axis=-1), mx.inf)
        rows = gap.min(axis=-1).tolist()
        print(f"  batch {number}: smallest margin per prompt {[round(r, 1) for r in rows]}")
        worst = min(worst, *rows)
    return worst


def check_with_mlx_vlm(folder: Path, prompts: list[Prompt]) -> list[str]:
    """Each prompt through mlx-vlm's own load and generate: the answers it gives."""
    from mlx_vlm import generate, load

    model, processor = load(str(folder))
    answers = []
    for prompt in prompts:
        text = processor.tokenizer.apply_chat_template(
            prompt.messages, tools=prompt.tools, tokenize=False, add_generation_prompt=True
        )
        image = None if prompt.rgb is None else [image_of(prompt)]
        result = generate(
            model, processor, text, image=image, max_tokens=400, temperature=0.0, verbose=False
        )
        answers.append(result.text.strip())
    return answers


def prompts_json(prompts: list[Prompt]) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "messages": p.messages,
            "image": None
            if p.rgb is None
            else {"kind": "llm-comply 0.5.0 specs/test_image.jpg"}
            if p.side == PHOTO
            else {"kind": "solid square", "rgb": list(p.rgb), "side": p.side},
            "expected": p.expected,
            **({} if p.tools is None else {"tools": p.tools}),
        }
        for p in prompts
    ]


def build(out: Path, steps: int, untrained: bool) -> int:
    from mlx_vlm.utils import load_processor

    for name in DATA_FILES:
        shutil.copyfile(OUT_DIR / name, out / name)
    write_tokenizer(out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = model_config(tokenizer)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model = make_model(config)
    processor = load_processor(out)
    documented = documented_prompts()
    if not untrained:
        data = batches(model, processor, training_prompts())
        print(
            f"training on {len(training_prompts())} prompts in {len(data)} batches for {steps} steps",
            flush=True,
        )
        started = time.monotonic()
        loss = train(model, data, steps)
        print(f"trained in {time.monotonic() - started:.0f}s, final loss {loss:.4f}")
        margin = min_margin(model, batches(model, processor, documented))
        print(f"smallest logit margin on the documented prompts: {margin:.2f}")
        if margin < MIN_MARGIN:
            print(f"margin below {MIN_MARGIN}: not written", file=sys.stderr)
            return 1
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "prompts.json").write_text(json.dumps(prompts_json(documented), indent=2) + "\n")
    checked = documented + ([] if untrained else held_out_prompts())
    failed = report_checks(checked, check_with_mlx_vlm(out, checked))
    return 0 if untrained else int(failed > 0)


def report_checks(checked: list[Prompt], answers: list[str]) -> int:
    """Print each checked prompt's answer against its documented one; how many differ."""
    failed = 0
    for prompt, answer in zip(checked, answers, strict=True):
        ok = answer == prompt.expected
        failed += not ok
        shown = answer if len(answer) < 120 else answer[:120] + "..."
        print(f"  {'ok ' if ok else 'BAD'} {prompt.name}: {shown!r} (expected {prompt.expected!r})")
    return failed


def run_cli(
    build_into: Any, out_dir: Path, steps: int, description: str, written: tuple[str, ...]
) -> int:
    """The build scripts' command line: build in a temporary folder, and copy the ``written``
    files into ``--out`` only when every documented prompt reproduced (the committed data
    files too when ``--out`` is elsewhere, so that folder loads on its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--untrained", action="store_true", help="write the random init only")
    parser.add_argument("--out", type=Path, default=out_dir)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if build_into(folder, args.steps, args.untrained):
            print("a documented prompt did not reproduce: nothing written", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        copied = written + (DATA_FILES if args.out.resolve() != out_dir.resolve() else ())
        for name in copied:
            shutil.copyfile(folder / name, args.out / name)
    print(f"wrote {args.out} in {time.monotonic() - started:.0f}s")
    return 0


def main() -> int:
    return run_cli(build, OUT_DIR, TRAIN_STEPS, __doc__.split("\n\n")[0], WRITTEN_FILES)


if __name__ == "__main__":
    sys.exit(main())
