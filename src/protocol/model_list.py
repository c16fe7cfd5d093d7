"""The ``GET /v1/models`` entry of the served model (pure).

Invariants:
- The SDK's ``Model`` fields (``id``, ``object``, ``created``, ``owned_by``) come first; then the
  metadata clients read to size their prompts instead of guessing (docs/api.md):
  ``context_window`` (tokens, prompt plus output), ``max_output_tokens`` (the most one response
  may generate: what is left of the window), ``input_modalities`` and ``output_modalities``,
  ``supports_reasoning`` and ``supports_tools``, and ``tool_call_format``.
"""

from __future__ import annotations

from typing import Any


def model_entry(
    *,
    alias: str,
    created: int,
    context_window: int,
    has_thinking: bool,
    tool_format: str,
    input_modalities: tuple[str, ...] = ("text",),
) -> dict[str, Any]:
    return {
        "id": alias,
        "object": "model",
        "created": created,
        "owned_by": "mlx-responses",
        "context_window": context_window,
        "max_output_tokens": context_window,
        "input_modalities": list(input_modalities),  # ["text", "image"]: a vision model
        "output_modalities": ["text"],
        "supports_reasoning": has_thinking,
        "supports_tools": tool_format != "none",
        "tool_call_format": tool_format,
    }
