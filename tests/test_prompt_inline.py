"""Which renders run in the caller's task rather than on a worker thread
(``prompt_maker.small_chat``): a plain chat under the limit of string content, counted
exactly; anything else (a part list, an image) by its ``repr``, so it is never under-counted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mlx_responses.text.prompt_maker import small_chat

texts = st.text(max_size=300)


@given(st.lists(texts, max_size=12), st.integers(min_value=1, max_value=2000))
def test_a_chat_of_strings_is_small_below_the_limit_only(contents: list[str], limit: int) -> None:
    chat = [{"role": "user", "content": text} for text in contents]
    assert small_chat(chat, limit) == (sum(len(text) for text in contents) < limit)


@given(st.lists(texts, min_size=1, max_size=6), st.integers(min_value=1, max_value=2000))
def test_parts_count_at_least_their_text(contents: list[str], limit: int) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": t}]} for t in contents]
    if not small_chat([{"role": "user", "content": t} for t in contents], limit):
        assert not small_chat(parts, limit)
