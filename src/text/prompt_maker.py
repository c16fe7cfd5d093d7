"""The model's text side: its chat template, tokenizer and grammar compiler, on the Trio side.

Invariants:
- A ``PromptMaker`` turns chat messages into the model's prompt ids and a grammar, and counts
  tokens. It holds only read-only things of the loaded model (tokenizer, the tokenizer's length
  bound, the grammar compiler, a vision model's image side) and never the model actor's state:
  its work runs on worker threads in the caller's task (tokenizer, Jinja, llguidance; no MLX),
  so a long render never holds up the model actor's mailbox; a small plain render (under
  ``INLINE_RENDER_CHARS`` of text, no tools, no images: well under a millisecond) runs in the
  task itself, where the thread's hand-off would cost more than the render.
- ``make_prompt`` is a prompt's one trip here: rendered (``render``; with ``keep``, only what
  ``known``, an earlier render, does not cover is tokenized, ``model/incremental_render.py``:
  the same ids, and this render comes back to be kept), ``decoding`` compiled
  (``CannotConstrain`` when it cannot be), and whether the prompt opened a reasoning block.
- A refused image is a 400 (``Invalid image``); images in a history replayed to a text-only
  model are a 400; ``PromptTooLong`` refuses a provably too long prompt untokenized.
- The chat template is compiled when a ``PromptMaker`` is built (the server's start), by
  rendering one plain turn (``warm_up_template``): the first request does not pay for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ..engine.constrain import CannotConstrain, Grammar, InvalidSchema
from ..engine.loader import LoadedModel, render_prompt
from ..engine.vision import MAX_IMAGE_BYTES, ImageError, VisionModel, decode_data_url, image_format
from ..formats import reasoning_opens_in_prompt
from ..protocol.decoding import Decoding
from ..protocol.errors import invalid_request
from ..protocol.items.images import holds_images
from ..protocol.prompt_memo import RenderedPrompt
from .chat import to_chat
from .incremental_render import IncrementalTokenizer
from .prompt_bounds import PromptTooLong, measure_tokenizer, render_within

# A plain chat with less text than this renders in the caller's task (measured: ~0.4 ms on the
# bundled model's template; the worker thread's hand-off costs ~1 ms on a busy loop).
INLINE_RENDER_CHARS = 4000


def small_chat(chat: Sequence[Mapping[str, Any]], limit: int = INLINE_RENDER_CHARS) -> bool:
    """Whether ``chat`` holds less than ``limit`` characters of string content (any other
    content, an image's or a part list's, counts as its ``repr``, once the rest is known)."""
    total = 0
    for message in chat:
        content = message.get("content")
        total += len(content) if isinstance(content, str) else len(repr(content))
        if total >= limit:
            return False
    return True


@dataclass(frozen=True, slots=True)
class ModelInfo:
    alias: str
    path: str
    context_window: int
    tool_format: str = "none"  # a ``formats`` registry name
    has_thinking: bool = False  # ``<think>`` tags or a format that carries reasoning
    input_modalities: tuple[str, ...] = ("text",)  # ("text", "image"): a vision model


@dataclass(frozen=True, slots=True)
class ModelPrompt:
    """A prompt made ready on the model's side (``PromptMaker.make_prompt``)."""

    ids: tuple[int, ...]
    rendered: RenderedPrompt | None  # the render, kept for the next turn (``keep_render``)
    grammar: Grammar | None  # the request's decoding rule, compiled
    opens_reasoning: bool  # the prompt already opened a reasoning block


# What the start renders once (``warm_up_template``): one plain user turn.
WARM_UP_CHAT: tuple[Mapping[str, str], ...] = ({"role": "user", "content": "Hello."},)


def warm_up_template(tokenizer: Any) -> bool:
    """Render ``WARM_UP_CHAT`` once, so the chat template is compiled at start rather than in
    the first request (~16 ms on the bundled model); whether it rendered. A template that
    refuses this chat is left to fail on the requests that meet it."""
    try:
        render_prompt(tokenizer, WARM_UP_CHAT)
    except Exception:
        return False
    return True


class PromptMaker:
    """Chat messages -> the model's prompt (``ModelHandle.prompts``)."""

    def __init__(self, info: ModelInfo, loaded: LoadedModel) -> None:
        self.info = info
        self.vision = loaded.vision  # a vision model's image side (None: text-only)
        self.constraints = loaded.constraints
        self._tokenizer = loaded.tokenizer
        self._bound = measure_tokenizer(loaded.tokenizer)
        self._incremental = IncrementalTokenizer.for_tokenizer(loaded.tokenizer, self._bound)
        warm_up_template(loaded.tokenizer)

    async def render(
        self,
        chat: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """Apply the chat template and tokenize on a worker thread (tokenizer only, no MLX).
        With ``max_tokens``, a prompt provably longer raises ``PromptTooLong`` untokenized."""
        tokenizer, bound = self._tokenizer, self._bound

        def plain(chat: Sequence[Mapping[str, Any]]) -> list[int]:
            if max_tokens is not None:  # cheap refusals (model/prompt_bounds.py)
                return render_within(tokenizer, bound, max_tokens, chat, tools, template_kwargs)
            return render_prompt(tokenizer, chat, tools, template_kwargs)

        vision = self.vision
        if vision is None:
            if any(holds_images(message.get("content")) for message in chat):
                # A history a vision model stored, replayed to a text-only one.
                raise invalid_request("The input holds images; this model is text-only.", "input")
            if not tools and small_chat(chat):
                return plain(chat)
            return await trio.to_thread.run_sync(plain, chat)
        # Images become the model's image tokens (model/vision.py); a refused one is a 400.
        try:
            return await trio.to_thread.run_sync(vision.render, chat, plain)
        except ImageError as exc:
            raise invalid_request(f"Invalid image: {exc}", "input") from None

    async def make_prompt(
        self,
        chat: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        max_tokens: int | None = None,
        *,
        keep: bool = False,
        known: RenderedPrompt | None = None,
        decoding: Decoding | None = None,
    ) -> ModelPrompt:
        """A prompt made ready in one ask: rendered (``render``; with ``keep``, only what
        ``known``, an earlier render, does not cover is tokenized, ``model/incremental_render.py``:
        the same ids, and this render comes back to be kept), ``decoding`` compiled
        (``CannotConstrain`` when it cannot be) and whether the prompt opened a reasoning block."""
        rendered = None
        if keep and not (
            self.vision is not None
            and any(holds_images(message.get("content")) for message in chat)
        ):  # a prompt with images is rendered whole
            args = (self._tokenizer, self._bound, max_tokens, chat, tools, template_kwargs, known)
            if not tools and small_chat(chat):
                rendered = self._incremental.render(*args)
            else:
                rendered = await trio.to_thread.run_sync(self._incremental.render, *args)
        if rendered is not None:
            ids = rendered.ids
        else:
            ids = tuple(await self.render(chat, tools, template_kwargs, max_tokens))
        grammar = None
        if decoding is not None:
            constraints, tool_format = self.constraints, self.info.tool_format
            try:
                if constraints is None:
                    raise RuntimeError(
                        "this model's tokenizer does not support constrained decoding"
                    )
                # llguidance on a worker thread (no MLX).
                grammar = await trio.to_thread.run_sync(constraints.follow, decoding, tool_format)
            except (InvalidSchema, NotImplementedError, RuntimeError) as exc:
                raise CannotConstrain(exc) from exc
        return ModelPrompt(ids, rendered, grammar, self.opens_reasoning(ids))

    def opens_reasoning(self, prompt: Sequence[int]) -> bool:
        """Whether the rendered prompt already opened a ``<think>`` block."""
        tail = self._tokenizer.decode(list(prompt[-8:]))
        return self.info.has_thinking and reasoning_opens_in_prompt(str(tail))

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False)) if text else 0


__all__ = [
    "MAX_IMAGE_BYTES",
    "CannotConstrain",
    "ImageError",
    "ModelInfo",
    "ModelPrompt",
    "PromptMaker",
    "PromptTooLong",
    "VisionModel",
    "decode_data_url",
    "image_format",
    "to_chat",
]
