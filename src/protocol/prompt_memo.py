"""A transport's memo of a rendered prompt, so a continuation tokenizes only what is new.

Invariants:
- ``RenderedPrompt`` is a rendered chat-template text with exactly the token ids a full render
  gives it, and the places where the tokenizer splits it at added tokens (``<|im_end|>`` ...).
  Any such value is a sound hint for any later text: only
  the part both texts share up to a common split is reused (``model/incremental_render.py``).
- ``splits`` are the added-token matches of ``text`` as the tokenizer splits it, in order:
  ``(start, end, count)`` with ``count`` the number of ids up to and including that token.
- ``PromptMemo`` is written once by the response task (when it renders the prompt, before
  admission) and read by the transport only after the response's log has closed; both are
  tasks on the one Trio thread, so the write happens before the read.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PromptMemo", "RenderedPrompt"]


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    text: str
    ids: tuple[int, ...]
    splits: tuple[tuple[int, int, int], ...]  # (start, end, ids up to and including it)


@dataclass(slots=True)
class PromptMemo:
    """What the previous turn rendered (a hint), and what this turn rendered (its result)."""

    previous: RenderedPrompt | None = None
    rendered: RenderedPrompt | None = None
