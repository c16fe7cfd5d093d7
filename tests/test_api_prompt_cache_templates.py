"""The prompt cache with a chat template that rewrites earlier turns (issue 12).

Qwen3-style templates drop the reasoning of assistant turns that come before the last user
message: a replayed history then renders differently from the prompt the previous turn was
generated from, right where the previous reply began. A copy of the bundled model whose template
does that (same weights, same tokenizer) shows what survives: the previous turn's whole prompt
(system, user turns, up to the assistant's opening) is reused, nothing after the rewrite is,
and the greedy text equals a cold server's.

With the KV caches these models use (trimmable), the lookup's trimmed-longer match already
serves that surviving prefix from the previous turn's entry (prompt + reasoning + reply): this
test proves the rewrite costs only the rewritten part. Models whose caches cannot be trimmed
are served by the end-of-prompt checkpoint instead, which is the same surviving prefix here.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, serve

from .conftest import MODEL, START_DEADLINE, output_text, server_settings

DEADLINE = 90
THINK = "Think, then answer: what is 2 + 2?"  # the bundled model reasons, then answers


def drop_earlier_reasoning(folder: Path, source: Path = BUNDLED_MODEL_PATH) -> Path:
    """A copy of ``source`` (the bundled model by default) whose template renders an assistant
    turn's reasoning only after the last user message (as Qwen3's does): a new user message
    rewrites the earlier turns."""
    copy = folder / "qwen3-style"
    shutil.copytree(source, copy)
    template = (copy / "chat_template.jinja").read_text()
    loop = "{%- for message in rest -%}"
    keep = "{%- if reasoning_content -%}"
    assert template.count(loop) == 1
    assert template.count(keep) == 1
    last_user = (
        "{%- set ns = namespace(last_user=-1) -%}"
        "{%- for m in rest -%}{%- if m.role == 'user' -%}"
        "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    )
    template = template.replace(loop, last_user + loop).replace(
        keep, "{%- if reasoning_content and loop.index0 > ns.last_user -%}"
    )
    (copy / "chat_template.jinja").write_text(template)
    return copy


async def start(nursery: trio.Nursery, path: Path, **model: Any) -> ServerHandle:
    settings = server_settings(**model)
    settings = dataclasses.replace(
        settings, model=dataclasses.replace(settings.model, model_path=str(path))
    )
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


async def two_turns(base_url: str) -> list[dict[str, Any]]:
    """Turn 1 reasons; turn 2 replays it (store: false) with a new user message."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        history: list[dict[str, Any]] = [{"role": "user", "content": THINK}]
        out = []
        for text in (None, "Reply with: goodbye"):
            if text is not None:
                history.append({"role": "user", "content": text})
            body = {"model": MODEL, "input": history, "store": False, "temperature": 0}
            reply = await http.post("/v1/responses", json={**body, "max_output_tokens": 60})
            assert reply.status_code == 200, reply.text
            data: dict[str, Any] = reply.json()
            history.extend(data["output"])
            out.append(data)
    return out


def cached(data: dict[str, Any]) -> int:
    return int(data["usage"]["input_tokens_details"]["cached_tokens"])


async def test_a_template_that_drops_earlier_reasoning_still_reuses_the_previous_prompt(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    rewriting = drop_earlier_reasoning(tmp_path)
    warm = await start(nursery, rewriting)
    cold = await start(nursery, rewriting, prompt_cache_bytes=0)
    stock = await start(nursery, BUNDLED_MODEL_PATH)
    with trio.fail_after(DEADLINE):
        hot = await two_turns(warm.base_url)
        fresh = await two_turns(cold.base_url)
        kept = await two_turns(stock.base_url)
    first, second = hot
    # Turn 1 reasoned; turn 2's template dropped that reasoning (its prompt is shorter than
    # the stock template's, which keeps it).
    assert [item["type"] for item in first["output"]] == ["reasoning", "message"]
    assert second["usage"]["input_tokens"] < kept[1]["usage"]["input_tokens"]
    # The surviving prefix, turn 1's whole prompt, is reused; the rewritten reply is not.
    assert cached(second) >= first["usage"]["input_tokens"]
    assert cached(second) < first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    # The stock template replays the reasoning as generated: reuse reaches into the reply.
    assert cached(kept[1]) > first["usage"]["input_tokens"] + 4
    # Same greedy text as a server that never saw the prefix.
    assert [output_text(r) for r in hot] == [output_text(r) for r in fresh]
    assert output_text(second) == output_text(fresh[1])
