"""Each family's format end to end through HTTP: the bundled model's weights and tokenizer with a
family's real chat template (``tests/fixtures/families``), so the server detects that family's
format; the model knows none of these notations, so a forced call is what proves the grammar and
the parser together: a streamed ``function_call`` with argument deltas, valid by construction, no
marker text in ``output_text``; and its replay with the call's output renders in the family's
template (DeepSeek's needs the arguments as a string).

Trained fixtures of each family's own architecture (the families work of issue 24) add the model's
own unforced output; this file proves the format side with the real server and the real SDK.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import trio
from openai import AsyncOpenAI

from mlx_responses.model.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.server import ServerHandle, serve
from tests.conformance import assert_stream_invariants, parse_sse

from .conftest import MODEL, START_DEADLINE, server_settings
from .test_formats_family_render import FAMILIES, FIXTURES

DEADLINE = 60
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        # Finite by construction (an untrained model would ramble in a free string); the
        # grammar tests cover free strings.
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "hourly": {"type": "boolean"},
        },
        "required": ["city", "unit", "hourly"],
        "additionalProperties": False,
    },
}
MARKERS = ("<tool_call>", "<arg_key>", "<|tool_call", "<minimax:", "<invoke", "tool\u2581", "call:")


def family_model(family: str, folder: Path) -> Path:
    """The bundled model with ``family``'s chat template."""
    target = folder / family
    shutil.copytree(BUNDLED_MODEL_PATH, target)
    shutil.copyfile(FIXTURES / family / "chat_template.jinja", target / "chat_template.jinja")
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return target


async def stream(http: httpx.AsyncClient, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    payload = {"model": MODEL, "temperature": 0, "max_output_tokens": 400, "stream": True, **body}
    async with http.stream("POST", "/v1/responses", json=payload) as reply:
        assert reply.status_code == 200, await reply.aread()
        return parse_sse(b"".join([c async for c in reply.aiter_bytes()]))


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_a_forced_call_streams_and_replays_in_the_family_format(
    family: str, nursery: trio.Nursery, tmp_path: Path
) -> None:
    settings = server_settings()
    settings = replace(
        settings, model=replace(settings.model, model_path=str(family_model(family, tmp_path)))
    )
    with trio.fail_after(START_DEADLINE):
        server: ServerHandle = await nursery.start(serve, settings)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        with trio.fail_after(DEADLINE):
            models = (await http.get("/v1/models")).json()["data"]
            assert models[0]["tool_call_format"] == FAMILIES[family]
            events = await stream(
                http,
                input="Reply with: hello",
                tools=[WEATHER],
                tool_choice={"type": "function", "name": "get_weather"},
            )
        final = assert_stream_invariants(events)
        (call,) = [item for item in final["output"] if item["type"] == "function_call"]
        assert call["name"] == "get_weather"
        arguments = json.loads(call["arguments"])
        assert set(arguments) == {"city", "unit", "hourly"}
        assert arguments["city"] in ("Paris", "Tokyo")
        assert arguments["unit"] in ("celsius", "fahrenheit")
        assert isinstance(arguments["hourly"], bool)
        deltas = [e["delta"] for n, e in events if n == "response.function_call_arguments.delta"]
        assert deltas
        assert "".join(deltas) == call["arguments"]
        texts = [e["delta"] for n, e in events if n == "response.output_text.delta"]
        assert not any(marker in "".join(texts) for marker in MARKERS)

    # The call and its output replayed through the family's template, with the SDK.
    async with AsyncOpenAI(
        base_url=f"{server.base_url}/v1", api_key="sk-local", max_retries=0, timeout=60
    ) as client:
        with trio.fail_after(DEADLINE):
            second = await client.responses.create(
                model=MODEL,
                previous_response_id=final["id"],
                tools=[WEATHER],  # type: ignore[list-item]
                temperature=0,
                max_output_tokens=8,
                input=[
                    {
                        "type": "function_call_output",
                        "call_id": call["call_id"],
                        "output": '{"temperature": 18}',
                    }
                ],
            )
    assert second.status in ("completed", "incomplete")
