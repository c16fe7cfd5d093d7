"""The hosted tools' items as input (``protocol/items/hosted_read.py``, ``write.py``,
``hosted_turns.py``): strict reading whose 400 names the JSON path, the round trip through what
we list and store, the private ``_model_text`` only on the server's own items, and rendering
for the model (a call and its output in order) through the bundled model's chat template, the
same render ``/v1/responses/input_tokens`` counts."""

from __future__ import annotations

import base64
import json
from functools import cache
from typing import Any

import pydantic
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from openai.types.responses import response_item
from openai.types.responses.response_function_web_search import ResponseFunctionWebSearch
from transformers import AutoTokenizer

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.protocol.errors import ApiError
from mlx_responses.protocol.items.compaction import (
    item_text,
    legal_splits,
    replay_view,
    transcript,
)
from mlx_responses.protocol.items.history import input_items, items_from_json
from mlx_responses.protocol.items.hosted_read import MODEL_TEXT_KEY, with_model_texts
from mlx_responses.protocol.items.hosted_turns import model_turns, search_arguments
from mlx_responses.protocol.items.read import decode_compaction, parse_item, read_item
from mlx_responses.protocol.items.values import (
    MCP_CALL_STATUSES,
    WEB_SEARCH_STATUSES,
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    HostedItem,
    InputMessage,
    McpApprovalRequest,
    McpApprovalResponse,
    McpCall,
    McpListTools,
    SearchAction,
    TurnItem,
    WebSearchCall,
)
from mlx_responses.protocol.items.write import encode_compaction, item_json
from mlx_responses.protocol.request import parse_input
from mlx_responses.text.chat import to_chat
from tests.conformance import assert_no_unknown_keys

# --- strategies -------------------------------------------------------------------------------

texts = st.text(max_size=12)
ids = st.text(min_size=1, max_size=12)
json_leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=6)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=3)


def as_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)  # as the reader keeps JSON it holds as text


actions = st.one_of(
    st.builds(
        SearchAction,
        st.just("search"),
        query=st.none() | texts,
        queries=st.none() | st.lists(texts, max_size=3).map(tuple),
        sources=st.none() | st.lists(texts, max_size=3).map(tuple),
    ),
    st.builds(SearchAction, st.just("open_page"), url=st.none() | texts),
    st.builds(SearchAction, st.just("find_in_page"), url=texts, pattern=texts),
)
listed_tools = st.lists(
    st.fixed_dictionaries(
        {"name": texts, "input_schema": json_objects},
        optional={"description": st.none() | texts, "annotations": st.none() | json_objects},
    ),
    max_size=3,
).map(as_text)
mcp_errors = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["http_error", "mcp_protocol_error"]),
            "code": st.integers(-(2**40), 2**40),
            "message": texts,
        }
    ),
    st.fixed_dictionaries({"type": st.just("mcp_tool_execution_error"), "content": json_values}),
).map(as_text)
hosted_items: st.SearchStrategy[HostedItem] = st.one_of(
    st.builds(WebSearchCall, ids, st.sampled_from(WEB_SEARCH_STATUSES), actions),
    st.builds(McpListTools, ids, texts, listed_tools, st.none() | texts),
    st.builds(
        McpCall,
        ids,
        texts,
        texts,
        texts,
        st.none() | st.sampled_from(MCP_CALL_STATUSES),
        st.none() | texts,
        st.none() | mcp_errors,
        st.none() | texts,
    ),
    st.builds(McpApprovalRequest, ids, texts, texts, texts),
    st.builds(McpApprovalResponse, texts, st.booleans(), st.none() | texts, st.none() | ids),
)

# The SDK's model of each item as listed (``GET /v1/responses/{id}/input_items``).
SDK_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "web_search_call": ResponseFunctionWebSearch,
    "mcp_list_tools": response_item.McpListTools,
    "mcp_call": response_item.McpCall,
    "mcp_approval_request": response_item.McpApprovalRequest,
    "mcp_approval_response": response_item.McpApprovalResponse,
}


# --- round trips ------------------------------------------------------------------------------


@given(hosted_items)
def test_a_hosted_item_round_trips_and_is_listed_in_the_sdk_shape(item: HostedItem) -> None:
    shaped = item_json(item, "id_1")
    assert read_item(shaped) == item
    assert parse_item(json.loads(json.dumps(shaped)), "input[0]") == item  # a client resends it
    model = SDK_MODELS[shaped["type"]].model_validate_json(json.dumps(shaped), strict=True)
    assert_no_unknown_keys(model, shaped["type"])
    # Its own id is listed, never a minted one (an approval response without one gets one).
    own = getattr(item, "id", None)
    assert shaped["id"] == (own if own is not None else "id_1")


@given(st.lists(hosted_items, max_size=4), texts)
# A hosted item's own id that happens to be the encoder's placeholder for a minted one is kept.
@example([WebSearchCall("-", "in_progress", SearchAction("open_page"))], "")
def test_hosted_items_round_trip_inside_a_compaction_item(
    retained: list[HostedItem], summary: str
) -> None:
    compaction = Compaction(summary, tuple(retained))
    assert decode_compaction(encode_compaction(compaction), "input[0]") == compaction


def test_an_approval_response_keeps_the_clients_id_or_gets_one() -> None:
    sent = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False}
    (parsed,) = parse_input([{**sent, "id": "mcpa_mine", "reason": "no"}])
    assert parsed == McpApprovalResponse("mcpr_1", False, "no")
    assert isinstance(parsed, McpApprovalResponse)
    assert parsed.id == "mcpa_mine"
    assert input_items([parsed])[0]["id"] == "mcpa_mine"
    (minted,) = input_items(parse_input([sent]))
    assert minted["id"].startswith("mcpa_")
    assert minted["reason"] is None


# --- strict reading: the 400 names the path ---------------------------------------------------

SEARCH = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "capital of France"},
}
LISTING = {
    "type": "mcp_list_tools",
    "id": "mcpl_1",
    "server_label": "weather",
    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
}
MCP_CALL = {
    "type": "mcp_call",
    "id": "mcp_1",
    "server_label": "weather",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "output": "sunny, 18C",
    "status": "completed",
}
APPROVAL_REQUEST = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "server_label": "weather",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
}
APPROVAL = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}


def edited(item: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``item`` with the value at dotted ``path`` set (``...`` deletes it)."""
    copy = json.loads(json.dumps(item))
    *parents, last = path.split(".")
    at: Any = copy
    for key in parents:
        at = at[int(key)] if isinstance(at, list) else at[key]
    if value is ...:
        del at[last]
    else:
        at[last] = value
    return copy


REFUSED = [
    (SEARCH, "id", ..., "id"),
    (SEARCH, "status", "done", "status"),
    (SEARCH, "status", ..., "status"),
    (SEARCH, "extra", 1, "extra"),
    (SEARCH, "action", ..., "action"),
    (SEARCH, "action", "search", "action"),
    (SEARCH, "action.type", "click", "action.type"),
    (SEARCH, "action.query", 3, "action.query"),
    (SEARCH, "action.url", "https://x", "action.url"),
    (SEARCH, "action.queries", "q", "action.queries"),
    (SEARCH, "action.queries", ["q", 2], "action.queries[1]"),
    (
        SEARCH,
        "action.sources",
        [{"type": "url", "url": "u", "title": "t"}],
        "action.sources[0].title",
    ),
    (SEARCH, "action.sources", [{"type": "page", "url": "u"}], "action.sources[0].type"),
    (SEARCH, "action.sources", [{"type": "url"}], "action.sources[0].url"),
    (SEARCH, "action", {"type": "find_in_page", "url": "u"}, "action.pattern"),
    (SEARCH, "action", {"type": "open_page", "url": 1}, "action.url"),
    (SEARCH, MODEL_TEXT_KEY, "what the model read", MODEL_TEXT_KEY),
    (LISTING, "tools", {}, "tools"),
    (LISTING, "tools.0.input_schema", ..., "tools[0].input_schema"),
    (LISTING, "tools.0.input_schema", "object", "tools[0].input_schema"),
    (LISTING, "tools.0.name", None, "tools[0].name"),
    (LISTING, "tools.0.annotations", [], "tools[0].annotations"),
    (LISTING, "tools.0.title", "x", "tools[0].title"),
    (LISTING, "error", False, "error"),
    (LISTING, "server_label", ..., "server_label"),
    (MCP_CALL, "arguments", {"city": "Paris"}, "arguments"),
    (MCP_CALL, "status", "done", "status"),
    (MCP_CALL, "output", 1, "output"),
    (MCP_CALL, "error", "boom", "error"),
    (MCP_CALL, "error", {"type": "oops"}, "error.type"),
    (MCP_CALL, "error", {"type": "http_error", "code": "401", "message": "x"}, "error.code"),
    (MCP_CALL, "error", {"type": "http_error", "code": True, "message": "x"}, "error.code"),
    (MCP_CALL, "error", {"type": "http_error", "code": 401}, "error.message"),
    (MCP_CALL, "error", {"type": "mcp_tool_execution_error"}, "error.content"),
    (MCP_CALL, "error", {"type": "mcp_tool_execution_error", "content": [], "x": 1}, "error.x"),
    (MCP_CALL, "id", ..., "id"),
    (MCP_CALL, "approval_request_id", 7, "approval_request_id"),
    (APPROVAL_REQUEST, "arguments", ..., "arguments"),
    (APPROVAL_REQUEST, "status", "completed", "status"),
    (APPROVAL, "approve", "yes", "approve"),
    (APPROVAL, "approve", ..., "approve"),
    (APPROVAL, "approval_request_id", ..., "approval_request_id"),
    (APPROVAL, "reason", 1, "reason"),
]


@pytest.mark.parametrize(
    ("item", "key", "value", "param"),
    REFUSED,
    ids=[f"{item['type']}-{key}-{param}" for item, key, _, param in REFUSED],
)
def test_a_malformed_hosted_item_is_a_400_naming_its_path(
    item: dict[str, Any], key: str, value: Any, param: str
) -> None:
    assert parse_input([{"role": "user", "content": "hi"}, item])  # the sample itself is good
    with pytest.raises(ApiError) as caught:
        parse_input([{"role": "user", "content": "hi"}, edited(item, key, value)])
    assert caught.value.status == 400
    assert caught.value.param == f"input[1].{param}"
    assert f"'input[1].{param}'" in caught.value.message


# --- the private model text -------------------------------------------------------------------


def test_the_model_text_is_read_only_on_the_servers_own_items() -> None:
    own = with_model_texts([SEARCH, MCP_CALL], {"ws_1": "[1] Paris\nhttps://p\nThe capital."})
    assert MODEL_TEXT_KEY not in SEARCH  # copies: the output items stay as listed
    assert own[1] is MCP_CALL
    parsed = read_item(own[0])
    assert isinstance(parsed, WebSearchCall)
    assert parsed.model_text == "[1] Paris\nhttps://p\nThe capital."
    assert parsed == read_item(SEARCH)  # the text is not part of what the item is
    assert MODEL_TEXT_KEY not in item_json(parsed)  # never listed nor stored
    # A client's input, and a compaction item's content (client data), refuse it by name.
    with pytest.raises(ApiError, match="Unknown parameter") as caught:
        parse_input([own[0]])
    assert caught.value.param == f"input[0].{MODEL_TEXT_KEY}"
    payload = {"v": 1, "summary": "s", "items": [own[0]]}
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=")
    with pytest.raises(ApiError, match="Unknown parameter"):
        decode_compaction(forged.decode(), "input[0]")


# --- rendering for the model ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ({"type": "search", "query": "paris"}, {"query": "paris"}),
        ({"type": "search", "queries": ["a", "b"]}, {"query": "a"}),
        ({"type": "search"}, {}),
        ({"type": "open_page", "url": "https://p"}, {"url": "https://p"}),
        (
            {"type": "find_in_page", "url": "https://p", "pattern": "capital"},
            {"url": "https://p", "pattern": "capital"},
        ),
    ],
)
def test_a_search_renders_as_the_web_search_call_its_action_took(
    action: dict[str, Any], arguments: dict[str, str]
) -> None:
    item = read_item({**SEARCH, "action": action})
    assert isinstance(item, WebSearchCall)
    assert search_arguments(item.action) == arguments
    call, output = model_turns(item)
    assert call == FunctionCall("ws_1", "web_search", json.dumps(arguments))
    assert isinstance(output, FunctionCallOutput)
    assert output.call_id == "ws_1"


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"action": {"type": "search", "sources": [{"type": "url", "url": "https://a"}]}}, None),
        ({"status": "failed"}, "The search failed."),
        ({}, "Searched."),
        ({MODEL_TEXT_KEY: "[1] Paris\nhttps://p\nThe capital."}, None),
    ],
)
def test_a_searchs_output_is_what_the_model_read_else_the_replayed_text(
    changes: dict[str, Any], text: str | None
) -> None:
    item = read_item({**SEARCH, **changes})
    assert item is not None
    (_, output) = model_turns(item)
    assert isinstance(output, FunctionCallOutput)
    if MODEL_TEXT_KEY in changes:
        assert output.output == changes[MODEL_TEXT_KEY]
    elif text is None:
        assert output.output == "[1] https://a"
    else:
        assert output.output == text


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({}, "sunny, 18C"),
        (
            {
                "output": None,
                "status": "failed",
                "error": {"type": "http_error", "code": 401, "message": "Unauthorized"},
            },
            "Error: Unauthorized",
        ),
        (
            {
                "output": None,
                "status": "failed",
                "error": {
                    "type": "mcp_tool_execution_error",
                    "content": [{"type": "text", "text": "no such city"}],
                },
            },
            "Error: no such city",
        ),
    ],
)
def test_an_mcp_call_renders_as_its_function_and_result(changes: dict[str, Any], text: str) -> None:
    item = read_item({**MCP_CALL, **changes})
    assert item is not None
    assert model_turns(item) == (
        FunctionCall("mcp_1", "mcp__weather__get_weather", '{"city": "Paris"}'),
        FunctionCallOutput("mcp_1", text),
    )


def test_an_mcp_call_cut_off_mid_arguments_renders_empty_arguments() -> None:
    item = read_item(
        {**MCP_CALL, "arguments": '{"city": "Pa', "status": "incomplete", "output": None}
    )
    assert item is not None
    call, _ = model_turns(item)
    assert isinstance(call, FunctionCall)
    assert call.arguments == "{}"


def test_listings_and_approvals_render_nothing_but_stay_in_the_history() -> None:
    stored = [LISTING, APPROVAL_REQUEST, {**APPROVAL, "id": "mcpa_1"}]
    items = items_from_json(stored)
    assert [type(item) for item in items] == [McpListTools, McpApprovalRequest, McpApprovalResponse]
    assert all(model_turns(item) == () for item in items)
    user = InputMessage("user", "hi")
    assert to_chat(None, [user, *items]) == to_chat(None, [user])
    approval = items[2]
    assert isinstance(approval, McpApprovalResponse)
    assert (approval.approval_request_id, approval.approve, approval.reason) == (
        "mcpr_1",
        True,
        None,
    )


@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_PATH))


def rendered(chat: list[dict[str, Any]]) -> str:
    """The prompt text the bundled model's chat template makes of ``chat`` (as
    ``engine.loader.render_prompt`` renders it, before tokenizing)."""
    text = tokenizer().apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    return text


def prompt_tokens(chat: list[dict[str, Any]]) -> int:
    return len(tokenizer().encode(rendered(chat), add_special_tokens=False))


CONVERSATION = [
    {"role": "user", "content": "What is the capital of France, and the weather there?"},
    LISTING,
    {**SEARCH, "action": {**SEARCH["action"], "sources": [{"type": "url", "url": "https://p"}]}},
    MCP_CALL,
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Paris [1]; sunny.", "annotations": []}],
    },
]


def test_hosted_calls_render_through_the_bundled_template_as_calls_and_outputs_in_order() -> None:
    items = parse_input(CONVERSATION)
    text = rendered(to_chat(None, items))
    markers = [
        "What is the capital of France",
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "capital of France"}}',
        "<tool_response>\n[1] https://p\n</tool_response>",
        '<tool_call>\n{"name": "mcp__weather__get_weather", "arguments": {"city": "Paris"}}',
        "<tool_response>\nsunny, 18C\n</tool_response>",
        "Paris [1]; sunny.",
    ]
    at = [text.find(marker) for marker in markers]
    assert -1 not in at, text
    assert at == sorted(at), text


def test_input_tokens_count_the_hosted_calls_and_their_outputs() -> None:
    """``/v1/responses/input_tokens`` counts the prompt ``prepare_prompt`` renders: the items
    read (as input, or replayed from a stored history) through ``to_chat`` and the template."""

    def count(items: list[dict[str, Any]]) -> int:
        return prompt_tokens(to_chat(None, parse_input(items)))

    user, answer = CONVERSATION[0], CONVERSATION[-1]
    bare = count([user, answer])
    with_search = count([user, CONVERSATION[2], answer])
    with_both = count([user, *CONVERSATION[1:]])
    assert bare < with_search < with_both
    # The listing alone adds nothing; replayed from storage, the same count.
    assert count([user, LISTING, answer]) == bare
    stored = input_items(parse_input(CONVERSATION))
    replayed = to_chat(None, items_from_json(stored))
    assert prompt_tokens(replayed) == with_both


# --- compaction walks them --------------------------------------------------------------------


def test_compaction_splits_after_a_hosted_call_and_keeps_an_approval_with_its_request() -> None:
    user = InputMessage("user", "hi")
    search, call = read_item(SEARCH), read_item(MCP_CALL)
    request, approval = read_item(APPROVAL_REQUEST), read_item(APPROVAL)
    assert search is not None
    assert call is not None
    assert request is not None
    assert approval is not None
    turns: list[TurnItem] = [user, search, call, request, approval, InputMessage("assistant", "ok")]
    # After each call (it holds its own output); never between the request and its answer.
    assert legal_splits(turns) == [2, 3]
    text = transcript(None, turns)
    assert "[assistant called web_search (ws_1)]" in text
    assert "[result of mcp_1]\nsunny, 18C" in text
    assert item_text(request) == ""  # what does not render is not in a summary either
    assert replay_view([user, search]) == [user, search]
