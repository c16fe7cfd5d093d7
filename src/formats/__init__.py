"""Model output formats: how each model family writes tool calls and reasoning (pure: no MLX,
no Trio; ``tests/test_formats_pure.py`` checks it).

One ``Format`` per family (``format.py``), registered by name in a registry:

- ``Format.matches(Detection)``: recognises the family from the chat template text, the
  vocabulary and ``tokenizer_config.json``'s ``tool_parser_type`` (mlx-lm 0.32.2's
  ``_infer_tool_parser``/``_infer_thinking`` rules are the floor). ``detect`` tries a named
  ``tool_parser_type`` first, then each format by ``priority``; ``--tool-format NAME``
  bypasses detection (``get(NAME)``).
- ``Format.new_parser(ParseOptions) -> Parser``: ``feed(text)``/``finish()`` return the events
  of ``base``: ``TextChunk``, ``ReasoningChunk``, ``ToolCallStart``/``ToolCallArgs``/
  ``ToolCallEnd`` (a call's name as the model wrote it: a namespaced tool's qualified name).
  Any split of the text into chunks gives the same events after ``stream.coalesce``.
- ``Format.call_grammar(tools, literal) -> str``: the Lark grammar of exactly one call of one
  of ``tools`` (``grammars.ForcedTool``: a function, or a custom tool with a text/regex/Lark
  format) in the format's own syntax; ``grammars.argument_rules`` gives each tool's arguments
  rule (``args_i``), ``literal`` writes a marker as its special token. None: the format cannot
  force a call (a forced call is then a 400 naming ``--tool-format``).
- ``Format.replay`` (``Replay``): where the template wants reasoning (``reasoning_content``,
  ``thinking``), arguments as an object or a string, a default description for a tool without
  one, template kwargs for ``reasoning.effort``.
- ``Format.reasons``: the format carries reasoning itself (harmony's analysis channel).

To add a family: a module here building a ``Format`` and calling ``register`` at import, then
one import line below. ``tagged`` holds today's four tag formats (Hermes, Qwen3-Coder XML,
Llama 3 JSON, Mistral, parsed by ``stream.StreamParser``); ``harmony`` is gpt-oss's;
``families`` registers the other families (their regions in ``family_regions``, their forced-call
grammars in ``family_grammars``; ``muse`` reads Muse's addressed messages). Every tool region
(``xml_kv``, ``json_sections``, ``gemma``, ``regions``) runs on one step driver,
``region.ToolRegion``, and supplies only its states.
"""

from __future__ import annotations

from . import families, harmony, tagged
from .base import (
    ParsedEvent,
    ReasoningChunk,
    TextChunk,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
)
from .format import (
    NONE,
    Detection,
    Format,
    ParseOptions,
    Parser,
    Replay,
    UnknownFormat,
    detect,
    get,
    names,
    register,
)
from .stream import coalesce, reasoning_opens_in_prompt

__all__ = [
    "NONE",
    "Detection",
    "Format",
    "ParseOptions",
    "ParsedEvent",
    "Parser",
    "ReasoningChunk",
    "Replay",
    "TextChunk",
    "ToolCallArgs",
    "ToolCallEnd",
    "ToolCallStart",
    "UnknownFormat",
    "coalesce",
    "detect",
    "families",
    "get",
    "harmony",
    "names",
    "reasoning_opens_in_prompt",
    "register",
    "tagged",
]
