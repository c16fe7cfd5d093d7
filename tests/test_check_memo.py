"""The check memo (issue 14): a tool schema resent every turn is checked once, with the
answer the check itself gives."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.protocol.check_memo import CheckMemo, json_key
from mlx_responses.protocol.tools.offered import _schema_problem, schema_problem

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
json_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def same_typed(a: Any, b: Any) -> bool:
    """The same JSON value made of the same Python types, key order included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_typed(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_typed(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(json_like, json_like)
def test_two_values_share_a_key_only_when_they_are_the_same(a: Any, b: Any) -> None:
    ka, kb = json_key(a), json_key(b)
    assert ka is not None
    assert kb is not None
    if not any(isinstance(v, float) and math.isnan(v) for v in (a, b)):
        assert (ka == kb) == same_typed(a, b)


def test_values_that_compare_equal_but_differ_in_type_or_order_have_different_keys() -> None:
    pairs = [(1, True), (1, 1.0), (0.0, -0.0), ({"a": 1, "b": 2}, {"b": 2, "a": 1})]
    for a, b in pairs:
        assert a == b
        assert json_key(a) != json_key(b)
    assert json_key([1]) != json_key((1,))


def test_a_value_that_is_not_json_like_or_too_big_has_no_key_and_is_checked_each_time() -> None:
    calls: list[Any] = []
    memo = CheckMemo(lambda v: calls.append(v) or len(calls))
    assert json_key({1, 2}) is None
    assert json_key(list(range(10)), max_nodes=5) is None
    assert memo({"a": {1, 2}}) == 1
    assert memo({"a": {1, 2}}) == 2
    assert len(memo) == 0


def test_the_memo_checks_once_and_keeps_at_most_its_bound() -> None:
    calls: list[Any] = []
    memo = CheckMemo(lambda v: calls.append(v) or f"checked {v!r}", max_entries=2)
    assert memo({"type": "object"}) == "checked {'type': 'object'}"
    assert memo({"type": "object"}) == "checked {'type': 'object'}"
    assert len(calls) == 1
    assert (memo.hits, memo.misses) == (1, 1)
    memo([1])
    memo([2])  # {"type": "object"} is the least recently used: out
    assert len(memo) == 2
    memo({"type": "object"})
    assert len(calls) == 4


schemas = st.recursive(
    st.sampled_from(["object", "string", 3, -1, 1.5, True, None, "array"]),
    lambda inner: (
        st.dictionaries(
            st.sampled_from(["type", "properties", "items", "required", "minItems", "enum", "x"]),
            inner,
            max_size=3,
        )
        | st.lists(inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(["type", "properties", "items", "required"]), schemas))
def test_a_memoized_schema_check_says_what_the_check_says(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) == _schema_problem(schema)
    assert schema_problem(schema) == _schema_problem(schema)  # the remembered answer too
