"""Loading a model folder with mlx-lm and rendering chat prompts with its template.

``load_model`` must run on the generation thread (it creates MLX arrays). ``render_prompt`` uses
only the tokenizer (Jinja and the Rust tokenizer, no MLX), so it may run on any worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .blas_threads import BlasThreads
from .constrain import Constraints
from .stream_parse import ToolFormat, detect_tool_format

DEFAULT_CONTEXT_WINDOW = 4096


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    path: str
    context_window: int
    tool_format: ToolFormat = "none"
    has_thinking: bool = False
    constraints: Constraints | None = None
    # The OpenBLAS thread count the generation thread set (None: OpenBLAS does not compute).
    blas: BlasThreads | None = None
    # MLX's version and default device in words, asked once here on the generation thread
    # (the only thread that calls MLX), so the start-up line and /status never call it.
    device: str = ""


def resolve_model_path(path_or_id: str) -> str:
    """A local folder stays as given; anything else is handed to mlx-lm as a hub id."""
    candidate = Path(path_or_id).expanduser()
    return str(candidate.resolve()) if candidate.exists() else path_or_id


def read_context_window(path: str) -> int:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return DEFAULT_CONTEXT_WINDOW
    config: Mapping[str, Any] = json.loads(config_file.read_text())
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT_WINDOW


def load_model(path: str) -> LoadedModel:
    from mlx_lm import load

    model, tokenizer = load(path)[:2]
    template = getattr(tokenizer, "chat_template", None) or ""
    try:
        constraints: Constraints | None = Constraints(tokenizer)
    except (TypeError, ValueError):
        constraints = None  # a slow tokenizer: no constrained decoding (documented)
    return LoadedModel(
        model,
        tokenizer,
        path,
        read_context_window(path),
        tool_format=detect_tool_format(template if isinstance(template, str) else ""),
        has_thinking=bool(getattr(tokenizer, "has_thinking", False)),
        constraints=constraints,
        device=device_words(),
    )


def device_words() -> str:
    """``MLX <version> on <device>`` (call it where MLX may run: the generation thread)."""
    import mlx.core as mx

    return f"MLX {getattr(mx, '__version__', '?')} on {mx.default_device()}"


def render_prompt(
    tokenizer: Any,
    chat: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of the chat-templated conversation, ending with the generation prompt."""
    tokens = tokenizer.apply_chat_template(
        [dict(m) for m in chat],
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=True,
        **dict(template_kwargs or {}),
    )
    return [int(t) for t in tokens]
