"""The Qwen3-VL fixture answers its documented prompts through mlx-vlm itself.

``tests/fixtures/vision/qwen3-vl/prompts.json`` lists each prompt, its image and its answer
(scripts/build_qwen3_vl_fixture.py, docs/vision.md "The Qwen3-VL fixture"): the colour of a
square, and Codex CLI's ``view_image`` round trip (the first turn calls the tool, the follow-up
carrying its image answers the colour). Run through mlx-vlm's own ``load`` and ``generate``,
greedy, each must come out exactly. The Codex records also carry the prompt the fixture was
trained on (the template's text and the processor's ids), checked here against the template,
the processor and the server's rendering of the captured requests.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio
from PIL import Image

from .scripts_loader import script

ROOT = Path(__file__).parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "vision" / "qwen3-vl"
PROMPTS: list[dict[str, Any]] = json.loads((FIXTURE / "prompts.json").read_text())
CODEX = {p["name"]: p for p in PROMPTS if "fixture" in p}
# chat_template.jinja of mlx-community/Qwen3-VL-4B-Instruct-4bit (docs/vision.md).
TEMPLATE_SHA256 = "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"
CALL = '<tool_call>\n{"name": "view_image", "arguments": {"path": "square.png"}}\n</tool_call>'
# One prompt: loading is done once per module; a Codex turn prefills ~1,150 tokens on a CPU.
DEADLINE = 120


def image_of(spec: dict[str, Any]) -> Image.Image:
    assert spec["kind"] == "solid square", spec
    side = spec["side"]
    return Image.new("RGB", (side, side), tuple(spec["rgb"]))


@pytest.fixture(scope="module")
def mlx_thread() -> Iterator[ThreadPoolExecutor]:
    """One thread for this module's MLX work, ended here with its streams cleared: MLX work on
    Trio's worker threads, which exit whenever idle, or on the main thread, whose compiled-
    function cache outlives the interpreter, can abort the process at exit
    (docs/testing.md, "MLX on the test's own thread")."""
    import mlx.core as mx

    with ThreadPoolExecutor(max_workers=1) as thread:
        yield thread
        thread.submit(lambda: (mx.synchronize(), mx.clear_streams())).result()


async def on_thread(thread: ThreadPoolExecutor, run: Callable[[], Any]) -> Any:
    with trio.fail_after(DEADLINE):
        return await trio.to_thread.run_sync(
            lambda: thread.submit(run).result(), abandon_on_cancel=True
        )


@pytest.fixture(scope="module")
def loaded(mlx_thread: ThreadPoolExecutor) -> tuple[Any, Any]:
    from mlx_vlm import load

    result: tuple[Any, Any] = mlx_thread.submit(load, str(FIXTURE)).result()
    return result


def test_the_chat_template_is_qwen3_vl_instructs_own() -> None:
    data = (FIXTURE / "chat_template.jinja").read_bytes()
    assert hashlib.sha256(data).hexdigest() == TEMPLATE_SHA256


def test_the_model_is_qwen3_vl_with_deepstack() -> None:
    config = json.loads((FIXTURE / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl"
    assert config["vision_config"]["deepstack_visual_indexes"]
    assert config["text_config"]["rope_scaling"]["mrope_interleaved"] is True


def test_the_documented_prompts_cover_every_colour_and_codexs_round_trip() -> None:
    answers = {p["expected"] for p in PROMPTS if p["image"] is not None}
    assert {"red", "green", "blue"} <= answers
    assert CODEX["codex_view_image_call"]["expected"] == CALL
    assert {CODEX[f"codex_view_image_{c}"]["expected"] for c in ("red", "green", "blue")} == {
        "red",
        "green",
        "blue",
    }


def test_codexs_turns_are_the_servers_rendering_of_the_captured_requests() -> None:
    """What the fixture was trained on is what the server makes of Codex's requests today."""
    build = script("build_qwen3_vl_fixture")
    for name, record in CODEX.items():
        body = json.loads((ROOT / record["fixture"]).read_text(encoding="utf-8"))
        messages, tools = build.codex_chat(body)
        assert record["messages"] == messages, name
        assert record["tools"] == tools, name


def test_codexs_prompts_are_the_templates_and_the_processors(loaded: tuple[Any, Any]) -> None:
    """The recorded text is the template's, the recorded ids the processor's expansion of it;
    the follow-up's ids continue the first turn's with the call as the model answers it, so a
    prompt cache of the first turn serves the follow-up."""
    _, processor = loaded
    tokenizer = processor.tokenizer
    image_token = json.loads((FIXTURE / "config.json").read_text())["image_token_id"]
    for name, record in CODEX.items():
        text = tokenizer.apply_chat_template(
            record["messages"], tools=record["tools"], tokenize=False, add_generation_prompt=True
        )
        assert text == record["prompt_text"], name
        images = None if record["image"] is None else [image_of(record["image"])]
        ids = processor(text=[text], images=images)["input_ids"].tolist()[0]
        assert ids == record["prompt_ids"], name
        assert ids.count(image_token) == (0 if images is None else 64), name
    call = CODEX["codex_view_image_call"]["prompt_ids"]
    answered = tokenizer.encode(CALL + "<|im_end|>", add_special_tokens=False)
    for colour in ("red", "green", "blue"):
        follow_up = CODEX[f"codex_view_image_{colour}"]["prompt_ids"]
        assert follow_up[: len(call) + len(answered)] == call + answered


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p["name"] for p in PROMPTS])
async def test_mlx_vlm_answers_each_documented_prompt(
    mlx_thread: ThreadPoolExecutor, loaded: tuple[Any, Any], prompt: dict[str, Any]
) -> None:
    from mlx_vlm import generate

    model, processor = loaded
    text = processor.tokenizer.apply_chat_template(
        prompt["messages"], tools=prompt.get("tools"), tokenize=False, add_generation_prompt=True
    )
    image = None if prompt["image"] is None else [image_of(prompt["image"])]
    run = functools.partial(
        generate,
        model,
        processor,
        text,
        image=image,
        max_tokens=100,
        temperature=0.0,
        verbose=False,
    )
    result = await on_thread(mlx_thread, run)
    assert result.text.strip() == prompt["expected"]


TEXT_ONLY = [p for p in PROMPTS if p["image"] is None]


@pytest.fixture(scope="module")
def text_model(mlx_thread: ThreadPoolExecutor) -> tuple[Any, Any]:
    from mlx_lm import load

    result: tuple[Any, Any] = mlx_thread.submit(load, str(FIXTURE)).result()
    return result


@pytest.mark.parametrize("prompt", TEXT_ONLY, ids=[p["name"] for p in TEXT_ONLY])
async def test_mlx_lms_text_model_answers_each_prompt_without_an_image(
    mlx_thread: ThreadPoolExecutor, text_model: tuple[Any, Any], prompt: dict[str, Any]
) -> None:
    """The server loads the language model with mlx-lm (its 1-D RoPE is M-RoPE's when a prompt
    has no image): Codex's first turn calls view_image there too."""
    from mlx_lm.generate import generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = text_model
    ids = tokenizer.apply_chat_template(
        prompt["messages"], tools=prompt.get("tools"), add_generation_prompt=True
    )
    if "prompt_ids" in prompt:
        assert ids == prompt["prompt_ids"]
    run = functools.partial(
        generate, model, tokenizer, ids, max_tokens=100, sampler=make_sampler(temp=0.0)
    )
    text = await on_thread(mlx_thread, run)
    assert text == prompt["expected"]
