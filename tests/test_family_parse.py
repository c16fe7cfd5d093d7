"""A family's own output read as the template writes it (issue 24): GLM-4.6 answers
``<|assistant|>`` with ``\\n<think>``, the newline being its template's markup. The trained fixture
showed it: that newline came back as a message of its own, and replayed, it rendered as a
second assistant turn. Whatever the chunking, it is dropped; other leading text is not.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlx_responses import formats
from mlx_responses.formats.base import ParsedEvent, ReasoningChunk, TextChunk
from mlx_responses.formats.format import ParseOptions
from mlx_responses.formats.stream import coalesce

GLM_CALL = (
    "\n<think>Look up the weather.</think>\n<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
)


def parse(family: str, pieces: list[str], *, tools: bool = True) -> list[ParsedEvent]:
    parser = formats.get(family).new_parser(
        ParseOptions(tools_enabled=tools, reasoning=True, starts_in_reasoning=False)
    )
    events: list[ParsedEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return coalesce(events + parser.finish())


def split(text: str, cuts: list[int]) -> list[str]:
    at = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]


@given(st.lists(st.integers(0, 200), max_size=8), st.booleans())
def test_whitespace_before_the_opening_reasoning_is_no_message(
    cuts: list[int], tools: bool
) -> None:
    events = parse("glm47", split(GLM_CALL, cuts), tools=tools)
    assert not any(isinstance(e, TextChunk) and not e.text.strip() for e in events), events
    assert events[0] == ReasoningChunk("Look up the weather.")


@given(st.lists(st.integers(0, 40), max_size=6))
def test_leading_text_that_opens_no_reasoning_is_kept(cuts: list[int]) -> None:
    for text in ("\nhello", " <thinking> aloud", "\n<thin"):
        assert parse("glm47", split(text, cuts)) == [TextChunk(text)]
