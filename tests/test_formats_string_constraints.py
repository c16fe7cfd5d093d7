"""A string parameter's ``pattern``, ``minLength`` and ``maxLength`` in the forced-call grammars
of the formats that write strings raw (key/value: GLM, LongCat, MiniMax, Muse Spark, MiniCPM,
Qwen3-Coder, Kimi K3; Gemma's quoted notation), as the JSON formats enforce them through
llguidance's JSON Schema support.

Hypothesis: for any such schema and any candidate value, the grammar accepts the call exactly
when the value satisfies the schema (JSON Schema's meaning: an unanchored pattern is searched
for; lengths count characters) and the format can write it (values of formats whose parser
strips them have no surrounding whitespace), and the parser reads back the value written.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_responses.formats.family_grammars import string_constraints
from mlx_responses.formats.grammars import InvalidSchema
from tests.test_formats_family_grammars import UNSTRIPPED, accepts, parse, write_call

FAMILIES = [
    "glm47",
    "longcat",
    "minimax_m2",
    "muse_spark",
    "minicpm5",
    "qwen3_coder",
    "kimi_k3",
    "gemma4",
    "function_gemma",
]
# Patterns whose meaning is the same in ECMA-262 (JSON Schema), Python's re and llguidance's
# regex syntax.
PATTERNS = [
    None,
    "^[a-z]+$",
    "[0-9]{2}",
    "^ab",
    "b$",
    "^(a|b1)*$",
    "a.b",
    "1/2",
    "^\\d{3}-\\d{2}$",
    "^[^ ]*$",
]
ALPHABET = "ab12-/ \n"


def satisfies(value: str, schema: dict[str, Any]) -> bool:
    pattern = schema.get("pattern")
    # ECMA-262's ``$`` is the very end (Python's also matches before a final newline)
    if pattern is not None and re.search(pattern.replace("$", "\\Z"), value) is None:
        return False
    return schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))


@st.composite
def string_schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    pattern = draw(st.sampled_from(PATTERNS))
    if pattern is not None:
        schema["pattern"] = pattern
    low = draw(st.none() | st.integers(0, 4))
    if low is not None:
        schema["minLength"] = low
    high = draw(st.none() | st.integers(low or 0, 6))
    if high is not None:
        schema["maxLength"] = high
    return schema


def candidates(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    anything = st.text(ALPHABET, max_size=8)
    pattern = schema.get("pattern")
    if pattern is None:
        return anything
    matching = st.from_regex(re.compile(pattern), fullmatch=False).filter(
        lambda s: "<" not in s and "\r" not in s
    )
    return st.one_of(anything, matching.map(lambda s: s[:10]))


def tool_for(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": "f",
        "parameters": {"type": "object", "properties": {"s": schema}, "required": ["s"]},
    }


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data(), family=st.sampled_from(FAMILIES), special=st.booleans())
def test_the_grammar_accepts_exactly_the_values_the_schema_allows(
    data: st.DataObject, family: str, special: bool
) -> None:
    schema = data.draw(string_schemas())
    value = data.draw(candidates(schema))
    writable = family in UNSTRIPPED or value == value.strip()
    text = write_call(family, "f", [("s", value)])
    tool = tool_for(schema)
    try:
        accepted = accepts(family, special, [tool], "f", text)
    except InvalidSchema as exc:  # llguidance refuses a schema no string satisfies (a 400)
        refused = str(exc)
        assert "nsatisfiable" in refused
        assert not satisfies(value, schema)
        return
    assert accepted == (satisfies(value, schema) and writable)
    if satisfies(value, schema) and writable:
        assert parse(family, text, [tool]) == [("f", {"s": value})]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_zip_code_pattern_is_forced(family: str) -> None:
    tool = tool_for({"type": "string", "pattern": "^[0-9]{5}$"})
    assert accepts(family, True, [tool], "f", write_call(family, "f", [("s", "75001")]))
    for wrong in ("7500", "750011", "75OO1"):
        assert not accepts(family, True, [tool], "f", write_call(family, "f", [("s", wrong)]))


def test_lengths_and_anchors_become_regexes() -> None:
    assert string_constraints({"type": "string"}) == []
    assert string_constraints({"minLength": 2, "maxLength": 4}) == ["(?s:.{2,4})"]
    assert string_constraints({"maxLength": 3}) == ["(?s:.{0,3})"]
    assert string_constraints({"pattern": "^a$"}) == ["(?:a)"]
    assert string_constraints({"pattern": "a\\$"}) == ["(?s:.*)(?:a\\$)(?s:.*)"]
    assert string_constraints({"pattern": "a/b"}) == ["(?s:.*)(?:a\\/b)(?s:.*)"]
