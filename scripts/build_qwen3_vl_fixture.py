"""Build the tiny Qwen3-VL fixture in ``tests/fixtures/vision/qwen3-vl/``, deterministically.

What it writes: a Qwen3-VL model of mlx-vlm's own ``qwen3_vl`` architecture (a ViT vision tower
with 16-pixel patches, interpolated position embeddings, a patch merger and one deepstack merger
whose features are added to the first decoder layer's output at the image tokens; a Qwen3
language model with interleaved multimodal RoPE), float32 (``config.json``,
``model.safetensors``); the bundled model's byte-level BPE tokenizer plus the vision marker
tokens, special as in the real tokenizer (``tokenizer.json``, ``tokenizer_config.json``: the
bundled one already carries Qwen3's ``<tool_call>``, ``<think>`` ... as plain added tokens);
Qwen3-VL-Instruct's real chat template and image processor config (``chat_template.jinja``,
``preprocessor_config.json``: committed data, never written here, sources named in
``docs/vision.md``) and ``prompts.json``: the documented prompts and their greedy answers, which
mlx-vlm's own ``load`` and ``generate`` reproduce.

Behaviour it is trained for: "What colour is the square?" (and rewordings, image before or
after the text) answers ``red``, ``green`` or ``blue`` for a square of that colour (sides 56 to
112 pixels, shades near the pure colour); and Codex CLI 0.171.0's ``view_image`` round trip
(tests/fixtures/codex-0.171.0-small-view-image-*.json): the first request answers
``<tool_call>\\n{"name": "view_image", "arguments": {"path": "square.png"}}\\n</tool_call>``, the
follow-up (that call replayed, its output the image) answers the square's colour. Codex's bodies
are rendered as the server renders them: each ``input_image`` becomes the ``ImageRef`` the HTTP
edge puts in its place, ``scripts/codex_prompts.py``'s ``render`` (the server's request parsing
and the ``hermes`` format's replay) gives the chat messages and tools, each image becomes the
template's ``<|vision_start|><|image_pad|><|vision_end|>`` (as ``model/vision.py`` writes it),
the real template renders the text and mlx-vlm's processor expands ``<|image_pad|>`` to one
token per merged patch (64 for every square: the processor scales each image up to 65,536
pixels). The
bundled model's plain prompts (``Reply with: hello`` ...) answer as the bundled model does.

Training, as ``scripts/build_vision_fixture.py`` (whose pieces it shares): a seeded random init,
then full-batch Adam with the loss on the answer tokens only. ``--untrained`` writes the random
init (loadable, answers nothing useful) and checks only that mlx-vlm loads and runs it.

Run: ``.venv/bin/python scripts/build_qwen3_vl_fixture.py`` (see docs/vision.md for the time
it takes). It is built in a temporary folder and checked through ``mlx_vlm.load`` and
``mlx_vlm.generate`` there; only when every documented prompt reproduces are the files copied
into place.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import base64
import copy
import io
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# isort: off
import build_vision_fixture as shared  # imports mlx_responses: OpenBLAS before MLX

# isort: on
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image
from tokenizers import Tokenizer

from build_vision_fixture import (
    COLOURS,
    DOCUMENTED_PROMPT,
    REWORDINGS,
    SHADES,
    TRAIN_SIDES,
    Prompt,
    image_of,
    image_turn,
    text_prompts,
)
from codex_prompts import render as render_codex
from fixture_training import PrefixCache
from mlx_responses.protocol.items.images import ImageRef, holds_images, text_of

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "vision" / "qwen3-vl"
FIXTURES = ROOT / "tests" / "fixtures"
DATA_FILES = ("chat_template.jinja", "preprocessor_config.json")
WRITTEN_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "prompts.json",
)

SEED = 20261203
TRAIN_STEPS = 100

# Codex CLI 0.171.0 with view_image on (the small profile): the first request and the follow-up
# carrying the tool's output, a 56x56 red PNG.
CODEX_TURN = "codex-0.171.0-small-view-image-turn.json"
CODEX_RESULT = "codex-0.171.0-small-view-image-tool-result.json"
# What the model answers to the first: the hermes call the server parses, and what Qwen3-VL's
# template writes again when the follow-up replays it (arguments as the server sends them).
VIEW_IMAGE_CALL = (
    '<tool_call>\n{"name": "view_image", "arguments": {"path": "square.png"}}\n</tool_call>'
)
CODEX_SIDE = 56
# The template's text for one image, as the server writes each image part (model/vision.py).
IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"


# --- Codex's turns ---------------------------------------------------------------------------


def codex_body(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return body


def with_images(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the HTTP edge hands it on (http/image_inputs.py): each ``input_image`` part of
    a function call's output is the ``ImageRef`` of the image it accepted."""
    out = copy.deepcopy(body)
    for item in out["input"]:
        if item.get("type") != "function_call_output" or not isinstance(item["output"], list):
            continue
        item["output"] = [
            ImageRef(p["image_url"], p.get("detail", "auto"))
            if p.get("type") == "input_image"
            else p
            for p in item["output"]
        ]
    return out


def codex_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The chat messages and tools the server hands Qwen3-VL's template for ``body``, each image
    part written as the template writes an image."""
    rendered = render_codex(with_images(body), "hermes")
    messages = []
    for message in rendered["messages"]:
        content = message.get("content")
        if holds_images(content):
            message = {**message, "content": text_of(content, IMAGE_TEXT)}
        messages.append(message)
    return messages, rendered["tools"]


def captured_image() -> Image.Image:
    """The PNG in Codex's captured follow-up (a solid red 56x56 square)."""
    body = codex_body(CODEX_RESULT)
    output = next(i for i in body["input"] if i.get("type") == "function_call_output")
    url = output["output"][0]["image_url"]
    data = base64.b64decode(url.split(",", 1)[1])
    return Image.open(io.BytesIO(data)).convert("RGB")


def codex_prompts(shades: bool) -> list[Prompt]:
    """The first turn (calls view_image) and the follow-up for each colour (answers it); with
    ``shades``, the follow-up also with each colour's shades (training)."""
    messages, tools = codex_chat(codex_body(CODEX_TURN))
    out = [Prompt("codex_view_image_call", messages, None, None, 0, VIEW_IMAGE_CALL, tools)]
    messages, tools = codex_chat(codex_body(CODEX_RESULT))
    for colour, rgb in COLOURS.items():
        for shade in [rgb, *(SHADES[colour] if shades else [])]:
            name = f"codex_view_image_{colour}" + ("" if shade == rgb else "_shade")
            out.append(Prompt(name, messages, colour, shade, CODEX_SIDE, colour, tools))
    return out


# --- prompts ---------------------------------------------------------------------------------


def documented_prompts() -> list[Prompt]:
    """The colour question for each colour, image first and last; Codex's turns; the bundled
    model's plain prompts."""
    out = [
        Prompt(
            f"{colour}_{'image_first' if first else 'text_first'}",
            image_turn(DOCUMENTED_PROMPT, first),
            colour,
            rgb,
            84,
            colour,
        )
        for colour, rgb in COLOURS.items()
        for first in (True, False)
    ]
    return out + codex_prompts(shades=False) + text_prompts()


def training_prompts() -> list[Prompt]:
    """The colour question: each colour and shade with each wording, image first and last;
    Codex's turns (the follow-up with each shade too); the bundled model's plain prompts. One
    side: the processor scales every square to 256x256 alike."""
    side = TRAIN_SIDES[1]
    out = [
        Prompt("train", image_turn(text, first), colour, shade, side, colour)
        for colour, rgb in COLOURS.items()
        for shade in [rgb, *SHADES[colour]]
        for text in (DOCUMENTED_PROMPT, *REWORDINGS)
        for first in (True, False)
    ]
    return out + codex_prompts(shades=True) + text_prompts()


# --- model -----------------------------------------------------------------------------------


def model_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """Qwen3-VL's config.json layout (text and vision settings nested), shrunk."""
    names = [*shared.VISION_TOKENS, "<|endoftext|>", "<|im_end|>"]
    ids = {t: tokenizer.token_to_id(t) for t in names}
    vocab = tokenizer.get_vocab_size()
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "hidden_size": 128,
            "intermediate_size": 384,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "hidden_act": "silu",
            "attention_bias": False,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 32768,
            "rope_theta": 5000000.0,
            # head_dim 32: its 16 rotary frequencies interleaved over (time, height, width) as
            # Qwen3-VL's [24, 20, 20] interleaves 64.
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": True,
            "vocab_size": vocab,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "torch_dtype": "float32",
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
            "out_hidden_size": 128,  # the mergers' output: the language model's width
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            # A 16x16 grid of learned position embeddings, interpolated to each image's grid
            # (Qwen3-VL's is 48x48).
            "num_position_embeddings": 256,
            # The first block's output goes, through its own merger, into the language model's
            # first layer (Qwen3-VL-4B: blocks 5, 11, 17 into layers 0, 1, 2).
            "deepstack_visual_indexes": [0],
            "initializer_range": 0.02,
        },
        "vocab_size": vocab,
        "eos_token_id": ids["<|im_end|>"],
    }


def make_model(config: dict[str, Any]) -> nn.Module:
    from mlx_vlm.models.qwen3_vl import Model, ModelConfig

    mx.random.seed(SEED)
    model = Model(ModelConfig.from_dict(json.loads(json.dumps(config))))
    mx.eval(model.parameters())
    return model


# --- training data ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Example:
    """Prompts encoded as mlx-vlm's processor encodes them, each followed by its answer and
    <|im_end|>, padded at the end to one width (causal attention: the padding changes nothing
    before it). The positions and image rows are worked out once (mlx-vlm does it per call)."""

    ids: mx.array  # (B, L)
    mask: mx.array  # (B, L): 1 where ids[b, j] is an answer token
    pixel_values: mx.array | None
    grid_thw: mx.array | None
    position_ids: mx.array  # (3, B, L)
    feature_index: mx.array | None  # (B, L): the vision tower's row for an image token
    is_image: mx.array | None  # (B, L) bool
    deepstack_index: mx.array | None  # (image tokens,): their feature rows, batch-major


def chat_text(processor: Any, prompt: Prompt) -> str:
    text: str = processor.tokenizer.apply_chat_template(
        prompt.messages, tools=prompt.tools, tokenize=False, add_generation_prompt=True
    )
    return text


def prompt_ids(processor: Any, prompts: list[Prompt]) -> tuple[list[list[int]], Any, Any]:
    """Each prompt's ids as the processor expands them, and its pixel arrays (or None)."""
    texts = [chat_text(processor, p) for p in prompts]
    if prompts[0].rgb is None:
        rows = [processor.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return rows, None, None
    images = [image_of(p) for p in prompts]
    inputs = processor(text=texts, images=images, padding=True)
    rows = [
        [int(i) for i, keep in zip(row, m, strict=True) if keep]
        for row, m in zip(
            inputs["input_ids"].tolist(), inputs["attention_mask"].tolist(), strict=True
        )
    ]
    return rows, inputs["pixel_values"], inputs["image_grid_thw"]


class ImageTable:
    """Distinct images, in the order first seen, and the first row of each one's features in
    the vision tower's output. A square's side changes no pixel the tower sees (the processor
    scales every square to 256x256), so a training step runs the tower once per colour."""

    def __init__(self) -> None:
        self.first_rows: dict[bytes, int] = {}
        self.pixels: list[Any] = []
        self.grids: list[Any] = []
        self.rows = 0

    def add(self, pixel_values: Any, grid: Any) -> list[int]:
        """Each image's first feature row (the processor's arrays, images in order)."""
        pixels, out, start = np.asarray(pixel_values), [], 0
        for thw in np.asarray(grid):
            size = int(np.prod(thw))
            chunk = pixels[start : start + size]
            start += size
            key = chunk.tobytes() + thw.tobytes()
            if key not in self.first_rows:
                self.first_rows[key] = self.rows
                self.rows += size // 4  # the merger folds 2x2 patches into one token
                self.pixels.append(chunk)
                self.grids.append(thw)
            out.append(self.first_rows[key])
        return out

    def arrays(self) -> tuple[mx.array, mx.array]:
        return mx.array(np.concatenate(self.pixels)), mx.array(np.stack(self.grids))


def encode(
    model: Any, processor: Any, prompts: list[Prompt], table: ImageTable | None = None
) -> Example:
    """One batch: prompts all with an image (of one size) or all without. With ``table``,
    its images are the table's (the batch holds no pixels); else its own."""
    tokenizer = processor.tokenizer
    rows, pixel_values, grid = prompt_ids(processor, prompts)
    answers = [
        tokenizer.encode(p.expected + "<|im_end|>", add_special_tokens=False) for p in prompts
    ]
    width = max(len(r) + len(a) for r, a in zip(rows, answers, strict=True))
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids, mask = [], []
    for r, a in zip(rows, answers, strict=True):
        fill = width - len(r) - len(a)
        ids.append(r + a + [pad] * fill)
        mask.append([0.0] * len(r) + [1.0] * len(a) + [0.0] * fill)
    ids_array = mx.array(ids)
    positions, _ = model.language_model.get_rope_index(ids_array, grid, None, None)
    if positions.ndim == 2:  # text only: the same position on all three axes
        positions = mx.broadcast_to(positions[None], (3, *positions.shape))
    if grid is None:
        return Example(ids_array, mx.array(mask), None, None, positions, None, None, None)
    own = table is None
    table = ImageTable() if table is None else table
    first_rows = table.add(pixel_values, grid)
    image_token = model.config.image_token_id
    # One image per prompt: its tokens take its features' rows in order.
    index, flags = [], []
    for row, first in zip(ids, first_rows, strict=True):
        k = 0
        index.append([])
        flags.append([])
        for token in row:
            index[-1].append(first + k if token == image_token else 0)
            flags[-1].append(token == image_token)
            k += token == image_token
    # The deepstack features, batch-major over the image tokens, as mlx-vlm hands them on.
    flat = [i for r, f in zip(index, flags, strict=True) for i, x in zip(r, f, strict=True) if x]
    pixels, grids = table.arrays() if own else (None, None)
    return Example(
        ids_array,
        mx.array(mask),
        pixels,
        grids,
        positions,
        mx.array(index, dtype=mx.int32),
        mx.array(flags),
        mx.array(flat, dtype=mx.int32),
    )


def batches(
    model: Any, processor: Any, prompts: list[Prompt], table: ImageTable | None = None
) -> list[Example]:
    """One batch per (image side, tools) in a fixed order: rows of one batch are near one
    length (Codex's turns are ten times the others)."""
    groups: dict[tuple[int, bool, bool], list[Prompt]] = {}
    for p in prompts:
        groups.setdefault((p.side, p.rgb is None, p.tools is not None), []).append(p)
    return [encode(model, processor, groups[key], table) for key in sorted(groups)]


@dataclass(frozen=True, slots=True)
class TrainingSet:
    """Every training prompt, for one forward pass a step: the vision tower runs once on the
    distinct images; Codex's turns run as one shared prefix and the rows that continue it (the
    follow-up for each image is the first turn's prompt, the call (its answer), then the tool
    turn up to the image, the same in every row: it runs once, and each row, from its image
    on, attends to its keys and values)."""

    batches: list[Example]  # the plain prompts (image rows without pixels: the table's)
    prefix: Example  # (1, P), its mask on the call and the <|im_end|> after it
    rows: Example  # (B, L - P): Codex's follow-ups from the first image token on
    pixel_values: mx.array  # the distinct images
    grid_thw: mx.array
    mask: mx.array  # every answer token (what the loss is averaged over)


def training_set(model: Any, processor: Any, prompts: list[Prompt]) -> TrainingSet:
    """``prompts`` as a ``TrainingSet``; checks that Codex's follow-up continues the first
    turn's prompt with the call as the model answers it."""
    table = ImageTable()
    plain = batches(model, processor, [p for p in prompts if p.tools is None], table)
    call = next(p for p in prompts if p.tools is not None and p.rgb is None)
    follow_ups = [p for p in prompts if p.tools is not None and p.rgb is not None]
    full = encode(model, processor, follow_ups, table)
    assert full.is_image is not None
    assert full.feature_index is not None
    ids = full.ids.tolist()
    start = full.is_image[0].tolist().index(True)
    assert all(row[:start] == ids[0][:start] for row in ids), "the follow-ups differ early"
    tokenizer = processor.tokenizer
    asked = tokenizer.encode(chat_text(processor, call), add_special_tokens=False)
    answer = tokenizer.encode(call.expected + "<|im_end|>", add_special_tokens=False)
    assert ids[0][: len(asked) + len(answer)] == asked + answer, "no call replayed as answered"
    mask = [0.0] * start
    mask[len(asked) : len(asked) + len(answer)] = [1.0] * len(answer)
    prefix = Example(
        full.ids[:1, :start],
        mx.array([mask]),
        None,
        None,
        full.position_ids[:, :1, :start],
        None,
        None,
        None,
    )
    rows = Example(
        full.ids[:, start:],
        full.mask[:, start:],
        None,
        None,
        full.position_ids[:, :, start:],
        full.feature_index[:, start:],
        full.is_image[:, start:],
        full.deepstack_index,
    )
    masks = [ex.mask.flatten() for ex in [*plain, prefix, rows]]
    pixels, grids = table.arrays()
    return TrainingSet(plain, prefix, rows, pixels, grids, mx.concatenate(masks))


def loss_of(model: Any, data: TrainingSet) -> mx.array:
    """The summed loss on every answer token of ``data`` (``shared.train``)."""
    vision = model.vision_tower(data.pixel_values, data.grid_thw)
    total = mx.array(0.0)
    for ex in data.batches:
        total = total + shared.answer_loss(logits_of(model, ex, vision=vision), ex.ids, ex.mask)
    caches = [PrefixCache() for _ in model.language_model.model.layers]
    prefix, rows = data.prefix, data.rows
    head = model.language_model(prefix.ids, cache=caches, position_ids=prefix.position_ids)
    total = total + shared.answer_loss(head.logits, prefix.ids, prefix.mask)
    tail = logits_of(model, rows, caches, vision)
    return total + shared.answer_loss(tail, rows.ids, rows.mask)


def logits_of(model: Any, ex: Example, cache: Any = None, vision: Any = None) -> mx.array:
    """mlx-vlm's forward pass (its get_input_embeddings, without its per-call Python loops):
    image features at the image tokens, deepstack features added after the first layers.
    ``vision``: the tower's output for the images ``ex`` indexes (else its own pixels')."""
    language = model.language_model
    embeds = language.model.embed_tokens(ex.ids)
    deepstack = None
    if ex.is_image is not None:
        if vision is None:
            vision = model.vision_tower(ex.pixel_values, ex.grid_thw)
        features, layers = vision
        embeds = mx.where(ex.is_image[..., None], features[ex.feature_index], embeds)
        deepstack = [layer[ex.deepstack_index] for layer in layers]
    out = language(
        ex.ids,
        inputs_embeds=embeds,
        cache=cache,
        position_ids=ex.position_ids,
        visual_pos_masks=ex.is_image,
        deepstack_visual_embeds=deepstack,
    )
    return out.logits  # type: ignore[no-any-return]


# --- the build -------------------------------------------------------------------------------


def prompts_json(processor: Any, prompts: list[Prompt]) -> list[dict[str, Any]]:
    """``build_vision_fixture.prompts_json``, and for Codex's turns what the model is trained
    on: the template's text (one ``<|image_pad|>`` per image) and the processor's ids (one
    image token per merged patch)."""
    records = shared.prompts_json(prompts)
    for prompt, record in zip(prompts, records, strict=True):
        if prompt.tools is None:
            continue
        fixture = CODEX_TURN if prompt.rgb is None else CODEX_RESULT
        record["fixture"] = f"tests/fixtures/{fixture}"
        if prompt.rgb is not None:
            record["image"]["source"] = (
                "the PNG in the fixture's function_call_output"
                if prompt.rgb == COLOURS["red"]
                else "the fixture's PNG with this colour substituted"
            )
        record["prompt_text"] = chat_text(processor, prompt)
        record["prompt_ids"] = prompt_ids(processor, [prompt])[0][0]
    return records


def build(out: Path, steps: int, untrained: bool) -> int:
    from mlx_vlm.utils import load_processor

    for name in DATA_FILES:
        shutil.copyfile(OUT_DIR / name, out / name)
    shared.write_tokenizer(out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = model_config(tokenizer)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model = make_model(config)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"vocab {config['vocab_size']}, {n_params:,} parameters", flush=True)
    processor = load_processor(out)
    documented = documented_prompts()
    red = captured_image()
    assert red.size == (CODEX_SIDE, CODEX_SIDE), red.size
    assert red.getcolors() == [(CODEX_SIDE * CODEX_SIDE, COLOURS["red"])], red.getcolors()
    if not untrained:
        train_prompts = training_prompts()
        data = training_set(model, processor, train_prompts)
        widths = [tuple(ex.ids.shape) for ex in [*data.batches, data.prefix, data.rows]]
        print(f"training on {len(train_prompts)} prompts, batches {widths}, {steps} steps")
        started = time.monotonic()
        loss = shared.train(model, [data], steps, loss_of)
        print(f"trained in {time.monotonic() - started:.0f}s, final loss {loss:.4f}")
        margin = shared.min_margin(model, batches(model, processor, documented), logits_of)
        print(f"smallest logit margin on the documented prompts: {margin:.2f}")
        if margin < shared.MIN_MARGIN:
            print(f"margin below {shared.MIN_MARGIN}: not written", file=sys.stderr)
            return 1
    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    records = prompts_json(processor, documented)
    (out / "prompts.json").write_text(json.dumps(records, indent=2) + "\n")
    # Untrained: that mlx-vlm loads and runs it (one image prompt, one Codex turn).
    checked = (
        documented[:1] + documented[7:8] if untrained else documented + shared.held_out_prompts()
    )
    failed = shared.report_checks(checked, shared.check_with_mlx_vlm(out, checked))
    return 0 if untrained else int(failed > 0)


def main() -> int:
    description = __doc__.split("\n\n")[0]
    return shared.run_cli(build, OUT_DIR, TRAIN_STEPS, description, WRITTEN_FILES)


if __name__ == "__main__":
    sys.exit(main())
