"""Every request field and input item type of the pinned `openai` SDK is honoured or refused
with a 400 naming it (issue 28, decision 3), against the real server.

The tables below say what this server does with each. A field or item type the SDK has and a
table lacks fails the test: the next SDK bump shows what is new, and the table (and
docs/api.md's) must decide it.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

import httpx2 as httpx
import pytest
import trio
from openai.types.responses import function_tool_param, response_create_params
from openai.types.responses import response_input_item_param as input_items
from openai.types.shared_params import reasoning as reasoning_params

from mlx_responses.protocol.items.read import Compaction
from mlx_responses.protocol.items.write import encode_compaction
from mlx_responses.server import ServerHandle

from .conftest import MODEL

DEADLINE = 60
BASE = {"model": MODEL, "input": "Reply with: hello", "temperature": 0, "max_output_tokens": 4}
USER = {"type": "message", "role": "user", "content": "Reply with: hello"}
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}

Honoured = Literal["honoured"]
# A value, and "honoured" (200) or the `param` its 400 names.
Case = tuple[Any, Honoured | str]

CREATE_FIELDS: dict[str, Case] = {
    "model": (MODEL, "honoured"),
    "input": ("Reply with: hello", "honoured"),
    "instructions": ("Be brief.", "honoured"),
    "max_output_tokens": (8, "honoured"),
    "max_tool_calls": (1, "honoured"),
    "metadata": ({"k": "v"}, "honoured"),
    "parallel_tool_calls": (False, "honoured"),
    "previous_response_id": ("resp_unknown", "previous_response_id"),
    "prompt_cache_key": ("key", "honoured"),
    "prompt_cache_options": ({"mode": "implicit", "prewarm": True, "ttl": "30m"}, "honoured"),
    "prompt_cache_retention": ("in_memory", "honoured"),
    "reasoning": ({"effort": "low", "summary": "auto"}, "honoured"),
    "safety_identifier": ("user-1", "honoured"),
    "service_tier": ("flex", "service_tier"),
    "store": (False, "honoured"),
    "stream_options": ({"include_obfuscation": False}, "honoured"),
    "temperature": (0.5, "honoured"),
    "text": ({"format": {"type": "text"}, "verbosity": "low"}, "honoured"),
    "tool_choice": ("none", "honoured"),
    "tools": ([TOOL], "honoured"),
    "top_logprobs": (2, "honoured"),
    "top_p": (0.5, "honoured"),
    "truncation": ("auto", "truncation"),
    "user": ("user-1", "honoured"),
    "background": (True, "honoured"),
    "context_management": ([{"type": "compaction", "compact_threshold": 100000}], "honoured"),
    "conversation": ("conv_unknown", "conversation"),
    "include": (["message.output_text.logprobs"], "honoured"),
    "prompt": ({"id": "pmpt_1"}, "prompt"),
    "image": ({"prompt": "x"}, "image"),
    "moderation": ({"mode": "x"}, "moderation"),
    "access_programs": (["x"], "access_programs"),
    "background_options": ({"x": 1}, "background_options"),
}
# Beyond the SDK: what real clients send that OpenAI accepts, and our extensions.
EXTRA_FIELDS: dict[str, Case] = {
    "stream": (False, "honoured"),
    "client_metadata": ({"thread_id": "t"}, "honoured"),
    "presence_penalty": (0.5, "honoured"),
    "frequency_penalty": (0.5, "honoured"),
    "chat_template_kwargs": ({"enable_thinking": False}, "honoured"),
    "seed": (7, "honoured"),
}

CALL = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
CALL_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "done"}
CUSTOM_CALL = {"type": "custom_tool_call", "call_id": "call_2", "name": "g", "input": "x"}
CUSTOM_OUTPUT = {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"}
SEARCH_CALL = {"type": "tool_search_call", "call_id": "call_3", "arguments": {"q": "f"}}
SEARCH_OUTPUT = {"type": "tool_search_output", "call_id": "call_3", "tools": [TOOL]}
REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Thinking."}]}
COMPACTION = {"type": "compaction", "encrypted_content": encode_compaction(Compaction("x", ()))}
WEB_SEARCH_CALL = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "hello"},
}
MCP_LIST_TOOLS = {
    "type": "mcp_list_tools",
    "id": "mcpl_1",
    "server_label": "s",
    "tools": [{"name": "t", "input_schema": {"type": "object"}}],
}
MCP_CALL = {
    "type": "mcp_call",
    "id": "mcp_1",
    "server_label": "s",
    "name": "t",
    "arguments": "{}",
    "output": "done",
}
MCP_APPROVAL_REQUEST = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "server_label": "s",
    "name": "t",
    "arguments": "{}",
}
MCP_REFUSAL = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False}
# Item type -> the input that carries it and "honoured", or the 400's `param`.
ITEM_TYPES: dict[str, tuple[list[dict[str, Any]], Honoured | str]] = {
    "message": ([USER], "honoured"),
    "function_call": ([USER, CALL, CALL_OUTPUT], "honoured"),
    "function_call_output": ([USER, CALL, CALL_OUTPUT], "honoured"),
    "custom_tool_call": ([USER, CUSTOM_CALL, CUSTOM_OUTPUT], "honoured"),
    "custom_tool_call_output": ([USER, CUSTOM_CALL, CUSTOM_OUTPUT], "honoured"),
    "tool_search_call": ([USER, SEARCH_CALL, SEARCH_OUTPUT], "honoured"),
    "tool_search_output": ([USER, SEARCH_CALL, SEARCH_OUTPUT], "honoured"),
    "reasoning": ([USER, REASONING, {**USER, "role": "assistant", "content": "hi"}], "honoured"),
    "compaction": ([COMPACTION, USER], "honoured"),
    # The hosted tools' items replay (a search or an MCP call as the call and its result; a
    # listing and the approvals render nothing), whether or not this request offers the tool.
    "web_search_call": ([USER, WEB_SEARCH_CALL, USER], "honoured"),
    "mcp_list_tools": ([USER, MCP_LIST_TOOLS, USER], "honoured"),
    "mcp_call": ([USER, MCP_CALL, USER], "honoured"),
    "mcp_approval_request": ([USER, MCP_APPROVAL_REQUEST, USER], "honoured"),
    # A refusal: nothing to run, the model answers without the call.
    "mcp_approval_response": ([USER, MCP_APPROVAL_REQUEST, MCP_REFUSAL], "honoured"),
    # Honoured as the final item (tests/test_compaction_trigger.py); elsewhere a 400.
    "compaction_trigger": ([USER, {"type": "compaction_trigger"}, USER], "input[1]"),
}
# Other hosted tools' calls and outputs, programs, item references: this server runs none of them.
REFUSED_ITEM_TYPES = frozenset(
    {
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "additional_tools",
        "configuration_update",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "item_reference",
        "program",
        "program_output",
    }
)


def sdk_item_types() -> set[str]:
    types: set[str] = set()
    for member in typing.get_args(input_items.ResponseInputItemParam):
        hints = typing.get_type_hints(member)
        literal = hints["type"]
        while typing.get_origin(literal) is not Literal:
            literal = typing.get_args(literal)[0]  # Required[...] / Optional[...]
        types.update(typing.get_args(literal))
    return types


def test_every_sdk_field_and_item_type_is_in_a_table() -> None:
    fields = set(response_create_params.ResponseCreateParamsBase.__annotations__)
    assert fields - set(CREATE_FIELDS) == set(), "new SDK fields: decide them"
    assert set(CREATE_FIELDS) - fields == set(), "fields the SDK no longer has"
    types = sdk_item_types()
    assert types - set(ITEM_TYPES) - REFUSED_ITEM_TYPES == set(), "new item types: decide"


async def post(server: ServerHandle, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            return await http.post("/v1/responses", json=body)


def check(reply: httpx.Response, outcome: str, what: str) -> None:
    if outcome == "honoured":
        assert reply.status_code == 200, f"{what}: {reply.text}"
        return
    assert reply.status_code in (400, 404), f"{what}: {reply.status_code} {reply.text}"
    error = reply.json()["error"]
    assert error["param"] == outcome, f"{what}: {error}"
    assert "Unknown parameter" not in error["message"]


@pytest.mark.parametrize("field", sorted({**CREATE_FIELDS, **EXTRA_FIELDS}))
async def test_each_field_is_honoured_or_refused_by_name(server: ServerHandle, field: str) -> None:
    value, outcome = {**CREATE_FIELDS, **EXTRA_FIELDS}[field]
    check(await post(server, {**BASE, field: value}), outcome, field)


@pytest.mark.parametrize("kind", sorted(set(ITEM_TYPES) | REFUSED_ITEM_TYPES))
async def test_each_input_item_type_is_honoured_or_refused_by_name(
    server: ServerHandle, kind: str
) -> None:
    if kind in ITEM_TYPES:
        items, outcome = ITEM_TYPES[kind]
    else:
        items, outcome = [USER, {"type": kind, "id": "x"}], "input[1].type"
    tools = [TOOL, {"type": "custom", "name": "g"}]
    check(await post(server, {**BASE, "input": items, "tools": tools}), outcome, kind)


@pytest.mark.parametrize(
    "effort",
    typing.get_args(
        typing.get_args(typing.get_type_hints(reasoning_params.Reasoning)["effort"])[0]
    ),
)
async def test_every_reasoning_effort_is_accepted_and_echoed(
    server: ServerHandle, effort: str
) -> None:
    reply = await post(server, {**BASE, "reasoning": {"effort": effort}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["reasoning"]["effort"] == effort


@pytest.mark.parametrize("key", sorted(function_tool_param.FunctionToolParam.__annotations__))
async def test_every_function_tool_field_is_accepted(server: ServerHandle, key: str) -> None:
    samples: dict[str, Any] = {
        "async": False,
        "allowed_callers": ["direct"],
        "defer_loading": False,
        "description": "A tool.",
        "output_schema": {"type": "object"},
        "strict": False,
    }
    tool = {**TOOL, key: samples[key]} if key in samples else TOOL
    reply = await post(server, {**BASE, "tools": [tool]})
    assert reply.status_code == 200, reply.text


async def test_an_assistant_message_phase_round_trips(server: ServerHandle) -> None:
    assistant = {"type": "message", "role": "assistant", "content": "hi", "phase": "commentary"}
    reply = await post(server, {**BASE, "input": [USER, assistant, USER]})
    assert reply.status_code == 200, reply.text
    async with httpx.AsyncClient(base_url=server.base_url, timeout=DEADLINE) as http:
        with trio.fail_after(DEADLINE):
            listed = await http.get(f"/v1/responses/{reply.json()['id']}/input_items")
            chained = await http.post(
                "/v1/responses",
                json={**BASE, "previous_response_id": reply.json()["id"], "store": True},
            )
            relisted = await http.get(f"/v1/responses/{chained.json()['id']}/input_items")
    phases = [item.get("phase") for item in listed.json()["data"]]
    assert phases == [None, "commentary", None]
    assert "commentary" in [item.get("phase") for item in relisted.json()["data"]]
    bad = await post(server, {**BASE, "input": [USER, {**assistant, "phase": "draft"}, USER]})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "input[1].phase"
