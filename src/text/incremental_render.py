"""A continuation's prompt tokenized incrementally: the history's ids reused, the rest tokenized.

A WebSocket continuation re-renders a history whose previous render the connection kept
(``protocol/prompt_memo.RenderedPrompt``). Tokenizing the whole history again is most of the
render's cost; this module tokenizes only the text after the part both renders share.

Invariants:
- Exact: :meth:`IncrementalTokenizer.tokenize` returns the ids
  ``tokenizer.encode(text, add_special_tokens=False)`` returns (what ``loader.render_prompt`` and
  ``prompt_bounds.render_within`` give), or ``None`` (the caller then renders the usual way).
- The template is always rendered in full: its text is the only truth about what it does with
  earlier turns (Qwen3's drops their reasoning, one with ``enable_thinking=False`` adds an empty
  think block to the generation prompt only). What is saved is tokenizing that text again.
- The premise (the one ``prompt_bounds.TokenBound.count_in_pieces`` rests on): the tokenizer
  splits a text at its added tokens before anything else and tokenizes the pieces between them
  independently, one id per added token; ``TokenBound.added`` is that split as a leftmost-longest
  pattern, given only for added tokens matched as plain strings. So a text's ids are its pieces'
  ids in order.
- Reuse: the known render's ids are kept up to the last added token of the longest run of
  splits both texts have alike (same start, same end, in order) and that lie inside the text
  both share. Up to there the texts and their splits are the same, so the pieces and their ids
  are too; the new text is scanned whole, so its splits after that point are its own.
- Checked once per tokenizer: the first text is tokenized both in pieces and whole; if the two
  differ (a tokenizer the premise does not hold for) the incremental path is off for good.
- Bounded like the usual path: a new part longer than ``prompt_bounds.PIECES_ABOVE`` characters
  is left to ``render_within`` (its early refusals); otherwise only that part is tokenized.
- Tokenizer only, no MLX: runs on a worker thread. The flags and the id cache it keeps are
  written under the GIL; two threads racing on the first check only check twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..protocol.prompt_memo import RenderedPrompt
from .prompt_bounds import PIECES_ABOVE, PromptTooLong, TokenBound

__all__ = ["IncrementalTokenizer", "common_prefix_length", "render_text"]

log = logging.getLogger(__name__)


def render_text(
    tokenizer: Any,
    chat: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The chat template's text, exactly as ``render_within`` renders it."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in chat],
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=False,
        **dict(template_kwargs or {}),
    )
    return str(text)


def common_prefix_length(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (C-speed slice compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low


class IncrementalTokenizer:
    """Tokenizes rendered prompts piece by piece, reusing a known render's ids."""

    def __init__(self, encode: Callable[[str], Sequence[int]], added: re.Pattern[str] | None):
        self._encode = encode
        self._added = added
        self._token_ids: dict[str, int] = {}
        self.enabled = added is not None
        self._checked = False

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, bound: TokenBound | None) -> IncrementalTokenizer:
        def encode(piece: str) -> Sequence[int]:
            return tokenizer.encode(piece, add_special_tokens=False)  # type: ignore[no-any-return]

        return cls(encode, bound.added if bound is not None else None)

    def _token_id(self, content: str) -> int | None:
        known = self._token_ids.get(content)
        if known is not None:
            return known
        ids = list(self._encode(content))
        if len(ids) != 1:
            return None  # not one added token: the premise does not hold
        self._token_ids[content] = int(ids[0])
        return int(ids[0])

    def tokenize(self, text: str, known: RenderedPrompt | None) -> RenderedPrompt | None:
        """``text``'s ids (and splits), reusing ``known``'s where both texts agree; ``None``
        when this tokenizer cannot be tokenized in pieces or the new part is too long."""
        added = self._added
        if not self.enabled or added is None:
            return None
        matches = [(m.start(), m.end()) for m in added.finditer(text)]
        ids: list[int] = []
        splits: list[tuple[int, int, int]] = []
        reused = 0
        if known is not None and known.splits:
            shared = common_prefix_length(known.text, text)
            limit = min(len(matches), len(known.splits))
            while reused < limit:
                start, end, _ = known.splits[reused]
                if matches[reused] != (start, end) or end > shared:
                    break
                reused += 1
            if reused:
                ids = list(known.ids[: known.splits[reused - 1][2]])
                splits = list(known.splits[:reused])
        position = splits[-1][1] if splits else 0
        if len(text) - position > PIECES_ABOVE:
            return None
        for start, end in matches[reused:]:
            if start > position:
                ids.extend(int(t) for t in self._encode(text[position:start]))
            token = self._token_id(text[start:end])
            if token is None:
                self.enabled = False
                return None
            ids.append(token)
            splits.append((start, end, len(ids)))
            position = end
        if position < len(text):
            ids.extend(int(t) for t in self._encode(text[position:]))
        if not self._checked:
            whole = [int(t) for t in self._encode(text)]
            self._checked = True
            if whole != ids:
                log.warning(
                    "the tokenizer does not tokenize in pieces; continuations tokenize whole"
                )
                self.enabled = False
                return None
        return RenderedPrompt(text, tuple(ids), tuple(splits))

    def render(
        self,
        tokenizer: Any,
        bound: TokenBound | None,
        max_tokens: int | None,
        chat: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        known: RenderedPrompt | None,
    ) -> RenderedPrompt | None:
        """Render ``chat`` and tokenize it against ``known``; with ``max_tokens``, a prompt the
        byte bound proves longer raises ``PromptTooLong`` untokenized (as ``render_within``)."""
        if not self.enabled:
            return None
        text = render_text(tokenizer, chat, tools, template_kwargs)
        if max_tokens is not None and bound is not None:
            at_least = bound.at_least_tokens(text)
            if at_least > max_tokens:
                raise PromptTooLong(at_least, max_tokens)
        return self.tokenize(text, known)
