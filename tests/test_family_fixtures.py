"""The per-family fixtures (issue 24): each loads as its real family would, answers its documented
prompts in its own notation, and the server reads its facts right.

``tests/fixtures/families/<family>/`` holds a tiny model of the family's own mlx-lm architecture
with its real chat template, built by ``scripts/build_family_fixtures.py`` (docs/models.md,
"Family fixtures"). A family whose fixture is not built yet is skipped.
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.engine.loader import load_model, read_context_window
from mlx_responses.engine.segments import chat_marks, render_without_generation_prompt

from .scripts_loader import script as _script
from .test_api_prompt_cache_templates import start

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "families"
DEADLINE = 120


SPECS = _script("family_specs")
FAMILIES: list[str] = list(SPECS.FAMILIES)


def built(family: str) -> Path:
    path = FIXTURES / family
    if not (path / "model.safetensors").exists():
        pytest.skip(f"{family}'s fixture is not built (scripts/build_family_fixtures.py)")
    return path


def test_every_family_commits_its_real_template_not_a_pointer() -> None:
    for family in FAMILIES:
        text = (FIXTURES / family / "chat_template.jinja").read_text(encoding="utf-8")
        assert not text.startswith("version https://git-lfs"), family
        assert "{%" in text, family
        assert "messages" in text, family


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fixture_answers_its_documented_prompts_in_its_own_notation(family: str) -> None:
    path = built(family)
    # On a thread that ends here: MLX keeps compiled functions in a thread-local cache, and the
    # main thread's is destroyed after the interpreter has gone (a segfault at exit).
    with ThreadPoolExecutor(max_workers=1) as thread:
        answers = thread.submit(answer_documented_prompts, path).result()
    for name, text, stop, record in answers:
        assert (name, text, stop) == (name, record["completion"], record["stop"])


def answer_documented_prompts(path: Path) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Each documented prompt's greedy completion and stop token, with its record."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    loaded = load_model(str(path))
    records = json.loads((path / "prompts.json").read_text(encoding="utf-8"))
    assert {r["name"] for r in records} >= {"hello", "tool_call", "tool_result"}
    answers = []
    for record in records:
        prompt = loaded.tokenizer.apply_chat_template(
            record["messages"],
            tools=record["tools"],
            add_generation_prompt=True,
            **record.get("template_kwargs", {}),
        )
        tokens = [
            r.token
            for r in stream_generate(
                loaded.model,
                loaded.tokenizer,
                prompt,
                max_tokens=record["completion_tokens"] + 8,
                sampler=make_sampler(temp=0.0),
            )
        ]
        text = loaded.tokenizer.decode(tokens[:-1])
        stop = loaded.tokenizer.convert_ids_to_tokens(tokens[-1])
        answers.append((record["name"], text, stop, record))
    return answers


@pytest.mark.parametrize("family", FAMILIES)
def test_the_build_script_reproduces_the_tokenizer_and_config(family: str) -> None:
    """The weights take minutes to train (checked by behaviour above); what they are trained
    on, the tokenizer and the config, must come out of the script byte for byte."""
    builder = _script("build_family_fixtures")
    path = built(family)
    spec = SPECS.FAMILIES[family]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "chat_template.jinja").write_bytes((path / "chat_template.jinja").read_bytes())
        tokenizer = builder.write_tokenizer(spec, out, builder.render_texts(spec, out))
        builder.write_json(out / "config.json", builder.model_config(spec, tokenizer))
        for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
            assert (out / name).read_bytes() == (path / name).read_bytes(), name


def test_the_context_window_is_read_from_a_nested_text_config(tmp_path: Path) -> None:
    gemma = built("gemma-4")
    assert read_context_window(str(gemma)) == 131072
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "x", "text_config": {"max_position_embeddings": 32768}})
    )
    assert read_context_window(str(tmp_path)) == 32768
    (tmp_path / "config.json").write_text(
        json.dumps({"max_position_embeddings": 8192, "text_config": {"seq_length": 32768}})
    )
    assert read_context_window(str(tmp_path)) == 8192


@pytest.mark.parametrize(
    ("family", "opening"),
    [("gpt-oss", "<|start|>user<|message|>"), ("gemma-4", "<|turn>user\n")],
)
def test_segment_marks_are_found_after_a_preamble_the_template_always_renders(
    family: str, opening: str
) -> None:
    """gpt-oss renders a system message before every chat, Gemma 4 a thinking system turn:
    the message marker opens those too, and the user message is the last one it opens."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(built(family))
    marks = chat_marks(render_without_generation_prompt(tokenizer))
    assert marks is not None
    assert tokenizer.decode(list(marks.user)) == opening


# What /v1/models says of each family: (tool_call_format, supports_reasoning).
FACTS: dict[str, tuple[str, bool]] = {
    "gpt-oss": ("harmony", True),
    "gemma-4": ("gemma4", True),
    "qwen3": ("hermes", True),
    "glm-4.6": ("glm47", True),
    "kimi-k2": ("kimi_k2", False),
    "minimax-m2": ("minimax_m2", True),
    "deepseek-v3.1": ("deepseek_v3", True),
    "qwen3-coder": ("qwen3_coder", False),
    "lfm2.5": ("pythonic", True),
}


@pytest.mark.parametrize("family", sorted(FACTS))
async def test_models_lists_the_family_facts(nursery: trio.Nursery, family: str) -> None:
    path = built(family)
    server = await start(nursery, path)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            listed: dict[str, Any] = (await http.get("/v1/models")).json()["data"][0]
    tool_format, reasoning = FACTS[family]
    config = json.loads((path / "config.json").read_text())
    window = (
        config.get("max_position_embeddings") or config["text_config"]["max_position_embeddings"]
    )
    assert listed["context_window"] == window
    assert listed["supports_tools"] is True
    assert listed["tool_call_format"] == tool_format
    assert listed["supports_reasoning"] is reasoning
