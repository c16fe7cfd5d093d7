"""Segment checkpoints' pure parts (issue 12): where a prompt is cut, and the exact-prefix rule.

``segments.boundaries`` against a ChatML-shaped renderer written here (a marker token opens every
message, a role token follows); ``PrefixCache.lookup`` with entries that cannot be trimmed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.engine.prefix_cache import PrefixCache, common_length
from mlx_responses.engine.segments import ChatMarks, boundaries, chat_marks, split

MARK, END, NL, BOS = 1, 2, 3, 0
ROLES = {"system": 10, "user": 11, "assistant": 12, "tool": 13}
GENERATION = [MARK, ROLES["assistant"], NL]

content_st = st.lists(st.integers(20, 30), max_size=4)
message_st = st.tuples(st.sampled_from(["user", "assistant", "tool"]), content_st)


def render(
    chat: Sequence[dict[str, Any]], bos: bool = False, generation: bool = False
) -> list[int]:
    tokens = [BOS] if bos else []
    for message in chat:
        content = message["content"]
        body = (
            [int(c) for c in content]
            if isinstance(content, list)
            else [20 + ord(c) % 10 for c in content]
        )
        tokens += [MARK, ROLES[message["role"]], NL, *body, END, NL]
    return tokens + (GENERATION if generation else [])


MARKS = chat_marks(render)


def test_the_marks_come_from_the_template() -> None:
    assert MARKS == ChatMarks(MARK, (MARK, ROLES["user"], NL))
    assert chat_marks(lambda chat: render(chat, bos=True)) == MARKS
    # A template with no token of its own per message: no checkpoints.
    assert chat_marks(lambda chat: [ord(c) for m in chat for c in m["content"]]) is None

    def broken(_: list[dict[str, Any]]) -> list[int]:
        raise ValueError("the template raised")

    assert chat_marks(broken) is None


@given(
    system=st.booleans(),
    bos=st.booleans(),
    messages=st.lists(message_st, min_size=1, max_size=8),
    after=st.integers(0, 60),
)
def test_the_boundaries_are_the_segment_starts_that_survive(
    system: bool, bos: bool, messages: list[tuple[str, list[int]]], after: int
) -> None:
    assert MARKS is not None
    chat = [{"role": "system", "content": [25]}] if system else []
    chat += [{"role": role, "content": content} for role, content in messages]
    prompt = render(chat, bos=bos, generation=True)
    # Where each rendered message starts, the generation prompt last.
    starts, at = [], int(bos)
    for message in chat:
        starts.append(at)
        at += 5 + len(message["content"])
    starts.append(at)
    assert prompt[at:] == GENERATION
    expected = {starts[1], starts[-1]}
    users = [i for i, m in enumerate(chat) if m["role"] == "user"]
    if users:
        expected.add(starts[users[-1] + 1])
    want = sorted(b for b in expected if after < b < len(prompt))
    cuts = boundaries(prompt, MARKS, after)
    assert list(cuts) == want
    assert all(prompt[b] == MARK and b > starts[0] for b in cuts)
    assert len(cuts) <= 3
    parts = split(prompt, after, cuts)
    assert [t for part in parts for t in part] == prompt[after:]
    assert all(parts[:-1])


@given(
    prompt=st.lists(st.integers(0, 4), max_size=30),
    after=st.integers(0, 30),
    cuts=st.lists(st.integers(-2, 32), max_size=5),
)
def test_split_keeps_every_token_in_order(prompt: list[int], after: int, cuts: list[int]) -> None:
    parts = split(prompt, after, sorted(set(cuts)))
    assert [t for part in parts for t in part] == prompt[after:]


def test_a_marker_inside_a_message_only_adds_a_checkpoint() -> None:
    assert MARKS is not None
    chat = [{"role": "user", "content": [MARK, 21]}, {"role": "assistant", "content": [22]}]
    prompt = render(chat, generation=True)
    cuts = boundaries(prompt, MARKS)
    assert cuts[-1] == len(prompt) - len(GENERATION)
    assert all(prompt[b] == MARK for b in cuts)


# -- the exact-prefix rule ------------------------------------------------------------------

entry_st = st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=8).map(tuple), st.booleans())


@given(
    entries=st.lists(entry_st, max_size=8),
    prompt=st.lists(st.integers(0, 2), max_size=10).map(tuple),
    slack=st.integers(0, 2),
)
def test_an_entry_that_cannot_be_trimmed_serves_only_prompts_it_is_a_prefix_of(
    entries: list[tuple[tuple[int, ...], bool]], prompt: tuple[int, ...], slack: int
) -> None:
    cache: PrefixCache[tuple[tuple[int, ...], bool]] = PrefixCache(1 << 20, 64)
    stored: dict[tuple[int, ...], bool] = {}
    for key, trimmable in entries:
        cache.insert("t", key, (key, trimmable), 1)
        stored[key] = trimmable
    limit = max(0, len(prompt) - slack)
    match = cache.lookup("t", prompt, limit=limit, trimmable=lambda value: value[1])
    # The best a correct cache can do: an exact prefix as it is, a trimmable entry trimmed.
    best = 0
    for key, trimmable in stored.items():
        if len(key) <= limit and prompt[: len(key)] == key:
            best = max(best, len(key))
        elif trimmable:
            best = max(best, min(common_length(key, prompt), limit))
    if match is None:
        assert best == 0
        return
    key, trimmable = match.value
    assert key == match.key
    assert match.reused == best
    if not trimmable:
        # Never trimmed: the entry is a prefix of the prompt and is used whole.
        assert match.trim == 0
        assert prompt[: len(key)] == key
