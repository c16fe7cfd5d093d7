"""The hosted-tools fixture (``tests/fixtures/hosted_model/``, alias ``hosted-tiny``): a model
trained to search the web, cite, call an MCP tool and answer from its result on its documented
prompts (``scripts/build_hosted_fixture.py``, docs/models.md, "The hosted-tools fixture").

Its stored prompts must be what the server renders today (rendered again here by the server's
own functions, through the builder's ``render``), and each greedy completion must come back
through mlx-lm, so a change in rendering or loading that breaks the fixture fails here by name.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio

from mlx_responses.hosted.local_index import LocalIndexBackend
from mlx_responses.hosted.web_search import SearchOptions
from mlx_responses.protocol.tools.hosted_text import search_result_text

from .scripts_loader import script as _script

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "hosted_model"
NAMES = ["web_search_call", "web_search_answer", "mcp_call", "mcp_answer"]
DEADLINE = 60


def records() -> dict[str, dict[str, Any]]:
    data = json.loads((FIXTURE / "prompts.json").read_text(encoding="utf-8"))
    return {record["name"]: record for record in data}


def load_tokenizer() -> tuple[Any, str]:
    from mlx_lm.tokenizer_utils import load

    from mlx_responses.engine.loader import detect_format, read_tool_parser_type

    tokenizer = load(FIXTURE)
    return tokenizer, detect_format(tokenizer, read_tool_parser_type(str(FIXTURE))).name


def test_the_fixture_is_small_and_documents_its_four_prompts() -> None:
    size = sum(path.stat().st_size for path in FIXTURE.iterdir())
    assert size < 3_000_000
    assert list(records()) == NAMES
    assert records()["web_search_answer"]["completion"] == "The capital of France is Paris [1]."


@pytest.mark.parametrize("name", NAMES)
async def test_the_stored_prompt_is_what_the_server_renders_now(name: str) -> None:
    builder = _script("build_hosted_fixture")
    tokenizer, tool_format = load_tokenizer()
    record = records()[name]
    with trio.fail_after(DEADLINE):
        ids = await builder.render(tokenizer, tool_format, record)
    assert ids == record["prompt_ids"]


async def test_the_approval_variant_renders_as_the_never_variant() -> None:
    """Approval items render nothing: the model reads the same prompts either way."""
    builder = _script("build_hosted_fixture")
    tokenizer, tool_format = load_tokenizer()
    stored = records()
    weather = stored["mcp_answer"]["output"][1]
    outside = builder.Outside(
        "", tuple(stored["mcp_call"]["output"][0]["tools"]), weather["output"]
    )
    with trio.fail_after(DEADLINE):
        variant = await builder.approval_variant(tokenizer, tool_format, outside)
    assert variant == [stored["mcp_call"]["prompt_ids"], stored["mcp_answer"]["prompt_ids"]]


async def test_the_stored_search_result_is_what_the_local_index_answers_now() -> None:
    search = records()["web_search_answer"]["output"][0]
    backend = LocalIndexBackend(ROOT / "tests" / "fixtures" / "web_index", timeout_s=10)
    with trio.fail_after(DEADLINE):
        await backend.ensure_index()
        sources = await backend.search(search["action"]["query"], SearchOptions())
        await backend.aclose()
    assert search["_model_text"] == search_result_text(
        [(s.title, s.url, s.snippet) for s in sources]
    )
    assert "file://" not in search["_model_text"]


def greedy_completions() -> list[tuple[str, str, str | None]]:
    """Each stored prompt's greedy completion and stop token through ``mlx_lm.load``."""
    import mlx_lm
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(FIXTURE))
    answers = []
    for name, record in records().items():
        tokens = [
            r.token
            for r in stream_generate(
                model,
                tokenizer,
                record["prompt_ids"],
                max_tokens=record["completion_tokens"] + 8,
                sampler=make_sampler(temp=0.0),
            )
        ]
        stop = tokenizer.convert_ids_to_tokens(tokens[-1]) if tokens else None
        answers.append((name, tokenizer.decode(tokens[:-1]), stop))
    return answers


def test_each_greedy_completion_reproduces_through_mlx_lm() -> None:
    # On a thread that ends here: MLX keeps compiled functions in a thread-local cache, and the
    # main thread's is destroyed after the interpreter has gone (a segfault at exit).
    with ThreadPoolExecutor(max_workers=1) as thread:
        answers = thread.submit(greedy_completions).result(timeout=DEADLINE)
    stored = records()
    expected = [(name, r["completion"], r["stop"]) for name, r in stored.items()]
    assert answers == expected
