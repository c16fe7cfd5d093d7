"""``include``: the values OpenAI accepts, and those that change what this server sends.

Invariants:
- Every one of OpenAI's ``ResponseIncludable`` values is accepted (on a create and on the
  conversation item routes); any other is a 400 naming it and listing the accepted ones.
- Three change what a Response carries: output-text logprobs, sealed reasoning
  (``reasoning.encrypted_content``) and a ``web_search_call``'s sources.
"""

from __future__ import annotations

from typing import Final

from ..protocol.errors import invalid_request

INCLUDABLE: Final = frozenset(
    {
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
    }
)
LOGPROBS_INCLUDE: Final = "message.output_text.logprobs"
SEALED_INCLUDE: Final = "reasoning.encrypted_content"
SOURCES_INCLUDE: Final = "web_search_call.action.sources"


def check_includable(value: str, param: str) -> None:
    """A 400 naming ``param`` unless ``value`` is one of OpenAI's ``include`` values."""
    if value not in INCLUDABLE:
        raise invalid_request(
            f"Invalid value for '{param}': {value!r}; supported values are "
            f"{', '.join(repr(v) for v in sorted(INCLUDABLE))}.",
            param,
        )
