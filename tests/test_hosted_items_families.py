"""The hosted tools' stored items replayed through each family's real chat template
(``tests/fixtures/families/``, as ``test_formats_family_render.py`` renders them): a
``web_search_call`` and an ``mcp_call`` render as the family writes a call and its result, and
the call the template writes reads back through the family's parser as the same call."""

from __future__ import annotations

import json

import pytest

from mlx_responses import formats
from mlx_responses.formats.base import ToolCallEnd
from mlx_responses.formats.format import ParseOptions
from mlx_responses.protocol.items.history import items_from_json
from mlx_responses.text.chat import to_chat
from tests.test_formats_family_render import FAMILIES, render

STORED = [
    {"type": "message", "role": "user", "content": "Weather in Paris?"},
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {
            "type": "search",
            "query": "weather Paris",
            "sources": [{"type": "url", "url": "https://example.org/paris"}],
        },
    },
    {
        "type": "mcp_call",
        "id": "mcp_1",
        "server_label": "weather",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "output": "sunny, 18C",
        "status": "completed",
    },
]
CALLS = [
    ("web_search", {"query": "weather Paris"}),
    ("mcp__weather__get_weather", {"city": "Paris"}),
]
SCHEMAS = {
    "web_search": {"type": "object", "properties": {"query": {"type": "string"}}},
    "mcp__weather__get_weather": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hosted_calls_replay_as_the_familys_calls_and_results(family: str) -> None:
    fmt = formats.get(FAMILIES[family])
    items = items_from_json(STORED)
    rendered = render(family, to_chat(None, items, fmt.replay))
    results = [rendered.find("[1] https://example.org/paris"), rendered.find("sunny, 18C")]
    assert -1 not in results, rendered
    assert results == sorted(results)
    start = rendered.rfind("Weather in Paris?")
    options = ParseOptions(tools_enabled=True, reasoning=False, tool_schemas=SCHEMAS)
    written = [rendered[start : results[0]], rendered[results[0] : results[1]]]
    for text, expected in zip(written, CALLS, strict=True):
        parser = fmt.new_parser(options)
        events = parser.feed(text) + parser.finish()
        calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEnd)]
        assert calls == [expected], text
