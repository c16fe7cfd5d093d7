"""The limits a prompt meets: which may be refused before they are tokenized (issue 17,
``model/prompt_bounds``), which do not fit, and the output budget left after one.

Invariants:
- A request whose over-long input is compacted rather than refused (``compact_threshold``
  set) has no limit: it must be tokenized to be compacted.
- Otherwise the limit is the longest prompt ``open_response`` admits, ``context_window - 1``
  tokens (one token of room for output), so the early refusal refuses exactly what the exact
  check would, only sooner.
- Generation is capped at the context left after the prompt (spec 000): a prompt fits when at
  least one token of output does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.errors import ApiError, invalid_request

if TYPE_CHECKING:
    from ..model.prompt_bounds import PromptTooLong
    from ..protocol.request import CreateRequest
    from .model import ModelHandle

__all__ = ["context_exceeded", "output_budget", "prompt_limit", "too_long_to_tokenize"]


def prompt_limit(request: CreateRequest, model: ModelHandle) -> int | None:
    """The most tokens ``request``'s prompt may have, or ``None`` when it must be tokenized."""
    if request.compact_threshold is not None:
        return None
    return model.info.context_window - 1


def too_long_to_tokenize(error: PromptTooLong, window: int) -> ApiError:
    return invalid_request(
        f"The input is at least {error.at_least} tokens, which does not fit the model's "
        f"context window of {window} tokens.",
        "input",
        code="context_length_exceeded",
    )


def context_exceeded(prompt: tuple[int, ...], window: int) -> ApiError:
    return invalid_request(
        f"The input is {len(prompt)} tokens, which does not fit the model's "
        f"context window of {window} tokens.",
        "input",
        code="context_length_exceeded",
    )


def output_budget(request: CreateRequest, prompt_tokens: int, window: int) -> int:
    """Generation is capped at the context left after the prompt (spec 000)."""
    room = window - prompt_tokens
    return min(request.config.max_output_tokens or room, room)
