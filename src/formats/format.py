"""The ``Format`` a model writes tool calls and reasoning in, and the registry of formats.

A format is one frozen value (``Format``) that knows, for one model family:

- ``matches``: whether a model uses it, from its chat template, vocabulary and
  ``tokenizer_config.json``'s ``tool_parser_type`` (``Detection``);
- ``new_parser``: an incremental ``Parser`` of one generation into ``ParsedEvent`` values;
- ``call_grammar``: the llguidance (Lark) grammar of exactly one forced call in its own syntax,
  or None when forced calls cannot be written in it;
- ``replay``: how its chat template wants history and request options (``Replay``).

Invariants:
- ``detect`` tries, in this order: the ``tool_parser_type`` a model's config names (a
  registered name or alias), then every registered format's ``matches`` by ascending
  ``priority`` (ties: registration order); no match gives ``NONE``.
- Names and aliases are unique across the registry; ``get`` refuses an unknown name with
  ``UnknownFormat`` listing the known ones.
- Pure: no MLX, no Trio, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .base import ParsedEvent, ParseOptions
from .grammars import ForcedTool

__all__ = [
    "NONE",
    "Detection",
    "Format",
    "ParseOptions",
    "Parser",
    "Replay",
    "UnknownFormat",
    "detect",
    "get",
    "names",
    "register",
]


@dataclass(frozen=True, slots=True)
class Detection:
    """What a format is recognised from."""

    template: str = ""  # the chat template's text
    vocab: Collection[str] = frozenset()  # every token's text, added tokens included
    tool_parser_type: str | None = None  # tokenizer_config.json's tool_parser_type


class Parser(Protocol):
    """One generation's text -> events, incrementally (see ``stream.StreamParser``)."""

    @property
    def tool_calls(self) -> int: ...

    def feed(self, text: str) -> list[ParsedEvent]: ...

    def finish(self) -> list[ParsedEvent]: ...


def _no_effort(effort: str | None) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Replay:
    """What a format's chat template wants to render history faithfully.

    ``reasoning_key``: the assistant message key reasoning goes under (``reasoning_content``,
    gpt-oss's ``thinking``). ``arguments``: a call's arguments as a JSON ``object`` or as its
    JSON ``string``. ``default_description``: given to a tool that has none (a template that
    reads ``tool.description`` unguarded fails without one). ``effort_kwargs``: the template
    keyword arguments for a request's ``reasoning.effort`` (the request's own
    ``chat_template_kwargs`` win). ``call_id``: ``(call_id, name, n) -> id`` the id a call
    (the ``n``-th in the conversation, from 0) and its output render under, for a template that
    writes the id into the model's own notation (Kimi K2's ``functions.NAME:N``); None keeps it.
    """

    reasoning_key: str = "reasoning_content"
    arguments: Literal["object", "string"] = "object"
    default_description: str | None = None
    effort_kwargs: Callable[[str | None], Mapping[str, Any]] = _no_effort
    call_id: Callable[[str, str, int], str] | None = None

    def template_tools(self, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Chat Completions tool shapes as this template renders them."""
        out: list[dict[str, Any]] = []
        for tool in tools:
            fn = tool.get("function")
            if self.default_description is not None and isinstance(fn, Mapping):
                if not fn.get("description"):
                    fn = {**fn, "description": self.default_description}
                    out.append({**tool, "function": fn})
                    continue
            out.append(dict(tool))
        return out

    def template_kwargs(
        self, effort: str | None, requested: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """The request's template kwargs on top of what its ``reasoning.effort`` implies."""
        implied = self.effort_kwargs(effort)
        return {**implied, **requested} if implied else requested


GrammarBuilder = Callable[[Sequence[ForcedTool], Callable[[str], str]], str]
"""``(tools, literal) -> Lark text``: one call of any of ``tools`` in the format's syntax, then
the end. ``literal(marker)`` writes a marker (as a special token where the tokenizer has one);
``grammars.argument_rules`` gives the ``args_i`` rules of each tool's arguments object."""


@dataclass(frozen=True, slots=True)
class Format:
    """One model family's notation for tool calls and reasoning (module docstring)."""

    name: str
    matches: Callable[[Detection], bool]
    new_parser: Callable[[ParseOptions], Parser]
    call_grammar: GrammarBuilder | None = None
    replay: Replay = field(default_factory=Replay)
    aliases: tuple[str, ...] = ()
    priority: int = 100  # detection order: lower first
    # The format itself carries reasoning (harmony's analysis channel), whatever the vocabulary.
    reasons: bool = False


class UnknownFormat(ValueError):
    """A format name that is not registered; the message lists the known names."""


def _never(detection: Detection) -> bool:
    return False


def _plain_parser(options: ParseOptions) -> Parser:
    from .stream import StreamParser  # the tag parser: ``<think>`` reasoning, no tool calls

    return StreamParser(
        tool_format="none",
        tools_enabled=False,
        reasoning=options.reasoning,
        starts_in_reasoning=options.starts_in_reasoning,
    )


NONE = Format("none", _never, _plain_parser, priority=1_000_000)
"""No known tool-call format: output is text (and ``<think>`` reasoning); no forced calls."""

_REGISTRY: dict[str, Format] = {}
_BY_NAME: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Adds ``fmt``; a name or alias already taken is a ``ValueError``."""
    for key in (fmt.name, *fmt.aliases):
        if key in _BY_NAME:
            raise ValueError(f"tool format name {key!r} is registered twice")
    _REGISTRY[fmt.name] = fmt
    for key in (fmt.name, *fmt.aliases):
        _BY_NAME[key] = fmt
    return fmt


register(NONE)


def names() -> tuple[str, ...]:
    """Every registered format's name, in detection order."""
    return tuple(f.name for f in _ordered())


def get(name: str) -> Format:
    """The format registered under ``name`` (or an alias); ``UnknownFormat`` otherwise."""
    fmt = _BY_NAME.get(name)
    if fmt is None:
        raise UnknownFormat(
            f"unknown tool format {name!r}; known formats: {', '.join(sorted(_REGISTRY))}"
        )
    return fmt


def _ordered() -> list[Format]:
    return sorted(_REGISTRY.values(), key=lambda f: f.priority)


def detect(detection: Detection) -> Format:
    """The format a model writes (module docstring: the order tried)."""
    named = detection.tool_parser_type
    if named and named in _BY_NAME:
        return _BY_NAME[named]
    for fmt in _ordered():
        if fmt.matches(detection):
            return fmt
    return NONE
