"""Issue 13's request surface, end to end: keys real clients send (client_metadata), the Open
Responses fields (store, presence_penalty, frequency_penalty) and their honouring."""

from __future__ import annotations

import logging
from typing import Any

import httpx2 as httpx
import pytest
import trio

from mlx_responses.server import ServerHandle
from tests.conformance import assert_stream_invariants, assert_strict_response, parse_sse

from .conftest import MODEL, output_text

DEADLINE = 60


async def post(server: ServerHandle, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        return await http.post(path, json=body)


async def create(server: ServerHandle, **body: Any) -> dict[str, Any]:
    reply = await post(
        server, "/v1/responses", {"model": MODEL, "temperature": 0, "max_output_tokens": 40, **body}
    )
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    assert_strict_response(data)
    return data


async def test_client_metadata_is_accepted(server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE):
        data = await create(
            server,
            input="Reply with: hello",
            client_metadata={"thread_id": "t1", "session_id": "s1", "turn_id": "u1"},
        )
    assert output_text(data) == "hello"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"client_metadata": {"a": 1}}, "client_metadata.a"),
        ({"client_metadata": "x"}, "client_metadata"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
    ],
)
async def test_bad_surface_values_name_their_key(
    server: ServerHandle, body: dict[str, Any], param: str
) -> None:
    with trio.fail_after(DEADLINE):
        reply = await post(server, "/v1/responses", {"model": MODEL, "input": "hi", **body})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param
    assert param in error["message"]


async def test_open_responses_fields_on_every_object_and_event(server: ServerHandle) -> None:
    body = {
        "model": MODEL,
        "input": "Reply with: hello",
        "temperature": 0,
        "store": False,
        "presence_penalty": 0.5,
        "stream": True,
    }
    with trio.fail_after(DEADLINE):
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
            http.stream("POST", "/v1/responses", json=body) as reply,
        ):
            raw = b"".join([c async for c in reply.aiter_bytes()])
    events = parse_sse(raw)
    assert_stream_invariants(events)
    with_response = [data["response"] for _, data in events if "response" in data]
    assert len(with_response) >= 3
    for response in with_response:
        assert response["store"] is False
        assert response["presence_penalty"] == 0.5
        assert response["frequency_penalty"] == 0.0
        assert "background" not in response  # spec 000: a foreground response has none


async def test_frequency_penalty_changes_greedy_output(server: ServerHandle) -> None:
    with trio.fail_after(DEADLINE):
        plain = await create(server, input="Count from 1 to 110.")
        penalised = await create(server, input="Count from 1 to 110.", frequency_penalty=2)
        again = await create(server, input="Count from 1 to 110.", frequency_penalty=2)
    assert output_text(plain).startswith("1 2 3 4 5")
    assert output_text(penalised) != output_text(plain)
    assert output_text(penalised) == output_text(again)  # greedy stays deterministic
    assert penalised["frequency_penalty"] == 2


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
MCP_NAMESPACE: dict[str, Any] = {
    "type": "namespace",
    "name": "mcp__weather",
    "description": "The weather MCP server.",
    "tools": [WEATHER_TOOL],
}


async def test_namespaced_call_carries_namespace_and_replays(server: ServerHandle) -> None:
    question = "What is the weather in Paris?"
    with trio.fail_after(DEADLINE):
        first = await create(
            server,
            input=question,
            tools=[MCP_NAMESPACE],
            tool_choice={"type": "function", "name": "get_weather"},
            store=False,
            # Not a documented prompt (this tool's description differs): the forced call's
            # city is whatever the weights produce, room for it to end.
            max_output_tokens=300,
        )
        (call,) = [item for item in first["output"] if item["type"] == "function_call"]
        assert call["name"] == "get_weather"
        assert call["namespace"] == "mcp__weather"
        assert first["tools"][0]["type"] == "namespace"
        # Codex's follow-up turn: the whole history again, the call with its namespace.
        reply = await post(
            server,
            "/v1/responses",
            {
                "model": MODEL,
                "temperature": 0,
                "max_output_tokens": 40,
                "store": False,
                "tools": [MCP_NAMESPACE],
                "input": [
                    {"role": "user", "content": question},
                    call,
                    {
                        "type": "function_call_output",
                        "id": "fco_1",
                        "call_id": call["call_id"],
                        "output": "sunny, 18C",
                    },
                ],
            },
        )
    assert reply.status_code == 200, reply.text
    assert_strict_response(reply.json())


def test_namespaced_function_is_offered_under_its_qualified_name() -> None:
    from mlx_responses.protocol.items.read import FunctionCall
    from mlx_responses.protocol.tools.parse import parse_tools
    from mlx_responses.text.chat import to_chat

    (tool,) = parse_tools([MCP_NAMESPACE])
    assert tool.name == "mcp__weather__get_weather"
    assert tool.for_template()["function"]["name"] == "mcp__weather__get_weather"
    chat = to_chat(None, [FunctionCall("c1", "get_weather", "{}", "mcp__weather")])
    assert chat[0]["tool_calls"][0]["function"]["name"] == "mcp__weather__get_weather"


# --- Sealed reasoning (decision 23) ------------------------------------------------------------

THINK = "Think, then answer: what is 2 + 2?"


@pytest.fixture
async def sealing_server(
    nursery: trio.Nursery, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> ServerHandle:
    """A server whose settings put its data dir (and so its reasoning secret) in tmp_path."""
    import dataclasses

    from mlx_responses.server import serve

    from .conftest import START_DEADLINE, server_settings

    monkeypatch.delenv("MLX_RESPONSES_REASONING_SECRET", raising=False)
    settings = dataclasses.replace(server_settings(), data_dir=str(tmp_path))
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    return handle


def test_the_reasoning_secret_file_is_a_setting_under_the_data_dir() -> None:
    """--reasoning-secret-file (or its environment variable) and --data-dir reach the settings;
    the default file follows --data-dir, not an environment hand-off."""
    from pathlib import Path

    from mlx_responses.cli import build_parser, settings_from_args
    from mlx_responses.storage.choice import default_data_dir

    def path_of(environ: dict[str, str], *argv: str) -> Path:
        args = build_parser(environ).parse_args(["serve", "--store", "memory", *argv])
        return settings_from_args(args).reasoning_secret_path()

    assert path_of({}) == Path(default_data_dir()) / "reasoning-secret"
    assert path_of({}, "--data-dir", "/d") == Path("/d/reasoning-secret")
    assert path_of({"MLX_RESPONSES_DATA_DIR": "/e"}) == Path("/e/reasoning-secret")
    assert path_of({}, "--data-dir", "/d", "--reasoning-secret-file", "/s") == Path("/s")
    environ = {"MLX_RESPONSES_REASONING_SECRET_FILE": "/f"}
    assert path_of(environ, "--data-dir", "/d") == Path("/f")
    assert path_of(environ, "--reasoning-secret-file", "/s") == Path("/s")  # the flag wins


async def input_tokens(server: ServerHandle, items: list[dict[str, Any]]) -> int:
    reply = await post(server, "/v1/responses/input_tokens", {"model": MODEL, "input": items})
    assert reply.status_code == 200, reply.text
    count: int = reply.json()["input_tokens"]
    return count


async def test_sealed_reasoning_replays_like_its_text(
    sealing_server: ServerHandle, tmp_path: Any
) -> None:
    server = sealing_server
    with trio.fail_after(DEADLINE):
        first = await create(
            server, input=THINK, store=False, include=["reasoning.encrypted_content"]
        )
        (reasoning,) = [item for item in first["output"] if item["type"] == "reasoning"]
        (message,) = [item for item in first["output"] if item["type"] == "message"]
        blob = reasoning["encrypted_content"]
        assert blob.startswith("mlxr1.")
        assert "2 plus 2" not in blob
        assert (tmp_path / "reasoning-secret").exists()  # under the settings' data dir
        user = {"role": "user", "content": THINK}
        follow = {"role": "user", "content": "Reply with: goodbye"}
        full = await input_tokens(server, [user, reasoning, message, follow])
        sealed_only = {**reasoning, "content": None}
        blob_alone = await input_tokens(server, [user, sealed_only, message, follow])
        other = {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "x"}],
        }
        other_text = await input_tokens(server, [user, other, message, follow])
        replay = await create(server, input=[user, sealed_only, message, follow], store=False)
    assert blob_alone == full
    assert other_text < full  # the blob's text is really rendered
    assert output_text(replay) == "goodbye"


async def test_tampered_or_foreign_blob_is_a_typed_400(sealing_server: ServerHandle) -> None:
    server = sealing_server
    from mlx_responses.protocol.items.sealed import Sealer

    with trio.fail_after(DEADLINE):
        first = await create(server, input=THINK, include=["reasoning.encrypted_content"])
        (reasoning,) = [item for item in first["output"] if item["type"] == "reasoning"]
        blob = reasoning["encrypted_content"]
        flipped = blob[:-3] + ("A" if blob[-3] != "A" else "B") + blob[-2:]
        foreign = Sealer(lambda: b"another server", MODEL).seal("2 plus 2 makes 4.")
        for bad in (flipped, foreign, "opaque"):
            items = [
                {"role": "user", "content": THINK},
                {**reasoning, "content": None, "encrypted_content": bad},
                {"role": "user", "content": "Reply with: goodbye"},
            ]
            reply = await post(server, "/v1/responses", {"model": MODEL, "input": items})
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["code"] == "invalid_encrypted_content"
            assert error["param"] == "input[1].encrypted_content"


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"type": 7}, "7 is not valid"),
        ({"type": "object", "properties": {"city": {"type": "strin"}}}, "strin"),
        ({"type": "object", "required": "city"}, "required"),
    ],
)
async def test_invalid_parameters_schema_names_the_tool(
    server: ServerHandle, parameters: dict[str, Any], fragment: str
) -> None:
    tool = {"type": "function", "name": "lookup", "parameters": parameters}
    with trio.fail_after(DEADLINE):
        reply = await post(
            server, "/v1/responses", {"model": MODEL, "input": "hi", "tools": [WEATHER_TOOL, tool]}
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "tools[1].parameters"
    assert "'lookup'" in error["message"]
    assert fragment in error["message"]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "m", "input": "x", "temperature": NaN}', "temperature"),
        (
            b'{"model": "m", "input": [{"role": "user", "content": "x"}], "metadata": {"a": Infinity}}',
            "metadata.a",
        ),
        (
            b'{"model": "m", "tools": [{"type": "function", "name": "f", "parameters": {"x": [1, -Infinity]}}]}',
            "tools[0].parameters.x[1]",
        ),
    ],
)
async def test_nan_error_names_its_key(server: ServerHandle, raw: bytes, param: str) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.post(
                "/v1/responses", content=raw, headers={"content-type": "application/json"}
            )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param
    assert f"'{param}'" in error["message"]


async def test_models_carry_the_context_window(server: ServerHandle) -> None:
    from openai.types import Model

    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            listed = (await http.get("/v1/models")).json()
            one = (await http.get(f"/v1/models/{MODEL}")).json()
    (entry,) = listed["data"]
    assert entry == one
    Model.model_validate(entry, strict=True)
    assert entry["context_window"] == server.model.info.context_window > 0
    assert entry["supports_tools"] is True
    assert entry["input_modalities"] == ["text"]


async def test_one_structured_log_line_per_request(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    import dataclasses
    import json

    from mlx_responses.http.auth import load_api_keys
    from mlx_responses.server import serve

    from .conftest import START_DEADLINE, server_settings

    key = "sk-secret-key-never-logged"
    (tmp_path / "keys").write_text(f"{key} alice\n")
    keys = load_api_keys([], str(tmp_path / "keys"))
    settings = dataclasses.replace(server_settings(), api_keys=keys)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    caplog.set_level(logging.INFO, logger="mlx_responses.requests")
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=handle.base_url, timeout=DEADLINE, headers=headers
    ) as http:
        with trio.fail_after(DEADLINE):
            created = await http.post(
                "/v1/responses",
                json={"model": MODEL, "input": "Reply with: hello", "temperature": 0},
            )
            async with http.stream(
                "POST",
                "/v1/responses",
                json={"model": MODEL, "input": "Reply with: hello", "stream": True},
            ) as streamed:
                raw = b"".join([c async for c in streamed.aiter_bytes()])
            refused = await http.post("/v1/responses", json={"model": MODEL})
            await http.get("/v1/models?x=1")
    lines = [
        json.loads(r.getMessage().removeprefix("request "))
        for r in caplog.records
        if r.name == "mlx_responses.requests"
    ]
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", "/v1/responses", 200),
        ("POST", "/v1/responses", 200),
        ("POST", "/v1/responses", 400),
        ("GET", "/v1/models", 200),
    ]
    assert lines[0]["response_id"] == created.json()["id"]
    assert lines[1]["response_id"] is not None
    assert lines[1]["response_id"].encode() in raw
    assert lines[1]["stream"] is True
    assert lines[2]["response_id"] is None
    assert all(line["tenant"] == "alice" for line in lines)
    assert all(line["duration_ms"] >= 0 for line in lines)
    text = caplog.text
    assert key not in text
    assert "hello" not in text
    assert refused.status_code == 400


# --- Anthropic Messages shape (the pinned anthropic SDK's types) --------------------------------


async def test_anthropic_message_has_the_sdk_shape_and_top_k_is_honoured(
    server: ServerHandle,
) -> None:
    from anthropic.types import Message

    from tests.conformance import unknown_keys

    def message(**extra: Any) -> dict[str, Any]:
        return {
            "model": MODEL,
            "max_tokens": 30,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            **extra,
        }

    with trio.fail_after(DEADLINE):
        greedy = await post(server, "/v1/messages", message(temperature=0))
        top1 = [
            await post(server, "/v1/messages", message(top_k=1, temperature=1)) for _ in range(3)
        ]
    assert greedy.status_code == 200, greedy.text
    body = greedy.json()
    parsed = Message.model_validate(body, strict=True)
    assert unknown_keys(parsed) == []
    usage = body["usage"]
    assert usage["cache_creation"] == {
        "ephemeral_1h_input_tokens": 0,
        "ephemeral_5m_input_tokens": 0,
    }
    assert usage["server_tool_use"] == {"web_fetch_requests": 0, "web_search_requests": 0}
    assert usage["service_tier"] == "standard"
    assert "inference_geo" in usage
    assert body["stop_details"] is None
    assert body["content"][0] == {
        "type": "text",
        "text": "The capital of France is Paris.",
        "citations": None,
    }
    # top_k=1 at temperature 1 leaves one candidate per step: the greedy answer.
    for reply in top1:
        assert reply.status_code == 200, reply.text
        assert reply.json()["content"] == body["content"]


# --- Custom tools and allowed_tools --------------------------------------------------------------

PATCH_TOOL: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]{3}-[0-9]{2}"},
}


async def stream_events(server: ServerHandle, body: dict[str, Any]) -> list[tuple[str, Any]]:
    payload = {"model": MODEL, "temperature": 0, "max_output_tokens": 60, "stream": True, **body}
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http,
        http.stream("POST", "/v1/responses", json=payload) as reply,
    ):
        assert reply.status_code == 200
        return parse_sse(b"".join([c async for c in reply.aiter_bytes()]))


async def test_forced_custom_tool_call_follows_its_regex_and_replays(server: ServerHandle) -> None:
    import re

    with trio.fail_after(DEADLINE):
        events = await stream_events(
            server,
            {
                "input": "Reply with: hello",
                "tools": [PATCH_TOOL, WEATHER_TOOL],
                "tool_choice": {"type": "custom", "name": "apply_patch"},
            },
        )
        final = assert_stream_invariants(events)
        (call,) = final["output"]
        assert call["type"] == "custom_tool_call"
        assert call["name"] == "apply_patch"
        assert re.fullmatch("[a-z]{3}-[0-9]{2}", call["input"])
        types = [name for name, _ in events]
        assert "response.custom_tool_call_input.delta" in types
        (done,) = [d for n, d in events if n == "response.custom_tool_call_input.done"]
        assert done["input"] == call["input"]
        assert final["tools"][0] == PATCH_TOOL
        replay = await create(
            server,
            input=[
                {"role": "user", "content": "Reply with: hello"},
                call,
                {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "ok"},
            ],
            tools=[PATCH_TOOL],
        )
    assert replay["status"] == "completed"


LARK_TOOL: dict[str, Any] = {
    "type": "custom",
    "name": "shout",
    "description": "Shout a word.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "BEGIN " WORD " END"\nWORD: /[a-z]{2,8}/\n',
    },
}


async def test_forced_lark_custom_tool_call_follows_its_grammar(server: ServerHandle) -> None:
    """A forced custom tool with a Lark grammar is constrained by it (it once was not: the
    input came back as free text)."""
    import re

    with trio.fail_after(DEADLINE):
        data = await create(
            server,
            input="Reply with: hello",
            tools=[LARK_TOOL, WEATHER_TOOL],
            tool_choice={"type": "custom", "name": "shout"},
        )
    (call,) = data["output"]
    assert call["type"] == "custom_tool_call"
    assert call["name"] == "shout"
    assert re.fullmatch("BEGIN [a-z]{2,8} END", call["input"]), call["input"]


async def test_allowed_tools_required_offers_and_forces_only_those(server: ServerHandle) -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_weather"}],
    }
    with trio.fail_after(DEADLINE):
        data = await create(
            server, input="Reply with: hello", tools=[PATCH_TOOL, WEATHER_TOOL], tool_choice=choice
        )
        bad = await post(
            server,
            "/v1/responses",
            {
                "model": MODEL,
                "input": "hi",
                "tools": [WEATHER_TOOL],
                "tool_choice": {**choice, "tools": [{"type": "function", "name": "nope"}]},
            },
        )
    (call,) = data["output"]
    assert call["type"] == "function_call"
    assert call["name"] == "get_weather"
    assert data["tool_choice"] == choice
    assert [tool["name"] for tool in data["tools"]] == ["apply_patch", "get_weather"]
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "tool_choice.tools[0]"


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "grammar", "syntax": "ebnf", "definition": "x"}, "tools[0].format.syntax"),
        ({"type": "grammar", "syntax": "regex", "definition": "("}, "tools[0].format.definition"),
        ({"type": "json"}, "tools[0].format.type"),
    ],
)
async def test_bad_custom_formats_are_400(
    server: ServerHandle, fmt: dict[str, Any], param: str
) -> None:
    tool = {"type": "custom", "name": "x", "format": fmt}
    with trio.fail_after(DEADLINE):
        reply = await post(
            server, "/v1/responses", {"model": MODEL, "input": "hi", "tools": [tool]}
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


async def test_default_temperature_applies_only_when_a_request_gives_none(
    nursery: trio.Nursery,
) -> None:
    import dataclasses

    from mlx_responses.server import serve

    from .conftest import START_DEADLINE, server_settings

    settings = dataclasses.replace(server_settings(), default_temperature=0.0)
    with trio.fail_after(START_DEADLINE):
        handle: ServerHandle = await nursery.start(serve, settings)
    body = {"model": MODEL, "input": "What is the capital of France?"}
    with trio.fail_after(DEADLINE):
        defaulted = [await post(handle, "/v1/responses", body) for _ in range(2)]
        explicit = await post(handle, "/v1/responses", {**body, "temperature": 1.5})
        message = {
            "model": MODEL,
            "max_tokens": 30,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        }
        messages = [await post(handle, "/v1/messages", message) for _ in range(2)]
    for reply in messages:
        assert reply.json()["content"][0]["text"] == "The capital of France is Paris."
    for reply in defaulted:
        data = reply.json()
        assert data["temperature"] == 0
        assert output_text(data) == "The capital of France is Paris."
    assert explicit.json()["temperature"] == 1.5
