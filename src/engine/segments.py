"""Where a rendered prompt may be checkpointed: the segment boundaries that survive re-rendering.

A model whose KV cache cannot be trimmed (recurrent or hybrid layers, a rotating cache past its
window) only reuses a cached entry that is an exact prefix of a new prompt. When a chat template
rewrites earlier turns (Qwen3 drops the reasoning of assistant turns before the last user
message; a thinking template opens the generation prompt differently from a replayed reply), the
entries of the previous turn are no longer prefixes. What still is: the prompt up to the start
of a message the rewrite did not touch. So while such a model prefills, the generation thread
stores extra entries (checkpoints) at those boundaries (``prompt_cache.py``, ``thread.py``),
as mlx-lm's server does for thinking models (system prompt, user turns, the assistant tail).

The boundaries come from the chat template: ``chat_marks`` renders two tiny conversations once
at load and finds the token every rendered message starts with (ChatML's ``<|im_start|>``,
Llama 3's ``<|start_header_id|>``, ...) and the tokens a user message starts with.

Invariants (pure; Hypothesis tests in ``tests/test_segments.py``):
- ``boundaries`` returns sorted, distinct positions ``b`` with ``after < b < len(prompt)``, each
  one the start of a rendered message (a ``marker`` position) after the first message's start:
  the end of the first message (the system prompt), the end of the last user message, and the
  start of the last message (the generation prompt). At most three.
- ``split`` cuts ``prompt[after:]`` at those boundaries; its parts, joined, are exactly it.
- A false boundary (the marker token inside a message's text) costs memory, never correctness:
  a checkpoint is keyed by exactly the tokens its cache holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Render = Callable[[list[dict[str, Any]]], Sequence[int]]


@dataclass(frozen=True, slots=True)
class ChatMarks:
    """What the chat template starts messages with: ``marker`` (one token, every message) and
    ``user`` (the tokens of a user message's opening, ``marker`` first)."""

    marker: int
    user: tuple[int, ...]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def chat_marks(render: Render) -> ChatMarks | None:
    """The template's message marks, from renders of ``[user]`` and ``[user, assistant]``
    (``render``: the chat's token ids, no generation prompt). None when the template opens
    messages with no single token of their own (no checkpoints then) or cannot render these."""
    try:
        one = [int(t) for t in render([{"role": "user", "content": "a"}])]
        other = [int(t) for t in render([{"role": "user", "content": "b"}])]
        two = [
            int(t)
            for t in render(
                [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
            )
        ]
    except Exception:
        return None
    if len(two) <= len(one) or two[: len(one)] != one:
        return None
    marker = two[len(one)]
    # Some templates render messages of their own before the user's (gpt-oss's system and
    # developer preamble, Gemma 4's thinking system turn): the marker opens those too, and
    # the user message is the last one it opens.
    if marker not in one or two.count(marker) != one.count(marker) + 1:
        return None
    start = len(one) - 1 - one[::-1].index(marker)
    user = tuple(one[start : max(start + 1, _common(one, other))])
    return ChatMarks(marker, user)


def message_starts(prompt: Sequence[int], marker: int) -> list[int]:
    """Every position of ``marker`` in ``prompt`` (C-speed ``index`` scans)."""
    tokens = prompt if isinstance(prompt, list | tuple) else list(prompt)
    starts: list[int] = []
    position = 0
    while True:
        try:
            position = tokens.index(marker, position)
        except ValueError:
            return starts
        starts.append(position)
        position += 1


def boundaries(prompt: Sequence[int], marks: ChatMarks, after: int = 0) -> tuple[int, ...]:
    """The checkpoint positions of ``prompt`` past ``after`` (the tokens already cached)."""
    starts = message_starts(prompt, marks.marker)
    if len(starts) < 2:
        return ()
    found = {starts[1], starts[-1]}
    user = marks.user
    for index in range(len(starts) - 2, -1, -1):
        at = starts[index]
        if tuple(prompt[at : at + len(user)]) == user:
            found.add(starts[index + 1])
            break
    return tuple(sorted(b for b in found if after < b < len(prompt) and b > starts[0]))


def split(prompt: Sequence[int], after: int, cuts: Sequence[int]) -> list[list[int]]:
    """``prompt[after:]`` cut at ``cuts`` (positions in ``prompt``, past ``after``)."""
    parts: list[list[int]] = []
    start = after
    for cut in cuts:
        if start < cut < len(prompt):
            parts.append(list(prompt[start:cut]))
            start = cut
    parts.append(list(prompt[start:]))
    return parts


def render_without_generation_prompt(tokenizer: Any) -> Render:
    """``render`` for ``chat_marks``: a Hugging Face tokenizer's chat template, tokenized."""

    def render(chat: list[dict[str, Any]]) -> Sequence[int]:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    return render
