"""``run_call`` of a web search over the real local index (``tests/fixtures/web_index``):
what the model reads next is ``search_result_text``'s documented layout, each source under
its title then its URL (the layout the hosted fixture was trained on), and the sources the
event machine gets are the same, in the same order."""

from __future__ import annotations

import json

import trio

from mlx_responses.actors.hosted_tools import HostedTools, run_call
from mlx_responses.hosted.local_index import LocalIndexBackend
from mlx_responses.protocol.tools.hosted import HostedSwitches, parse_web_search

from .test_api_hosted_tools import INDEX

DEADLINE = 30


async def test_a_search_reads_as_numbered_title_url_snippet() -> None:
    tool = parse_web_search({"type": "web_search"}, "tools[0]", HostedSwitches(web_search=True))
    assert tool is not None
    backend = LocalIndexBackend(INDEX, 10)
    with trio.fail_after(DEADLINE):
        await backend.ensure_index()
        ran = await run_call(
            tool,
            json.dumps({"query": "capital of France"}),
            None,  # type: ignore[arg-type]  # a search reads nothing of the request
            HostedTools(backend),
        )
    assert ran.result.ok
    sources = ran.result.sources
    assert sources, ran.text
    blocks = ran.text.split("\n\n")
    assert len(blocks) == len(sources)
    for number, (block, (url, title)) in enumerate(zip(blocks, sources, strict=True), 1):
        lines = block.split("\n")
        assert lines[0] == f"[{number}] {title}"
        assert lines[1] == url
