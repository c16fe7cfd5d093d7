"""Loading a model folder with mlx-lm and rendering chat prompts with its template.

``load_model`` must run on the generation thread (it creates MLX arrays). ``render_prompt`` uses
only the tokenizer (Jinja and the Rust tokenizer, no MLX), so it may run on any worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import formats
from .blas_threads import BlasThreads
from .constrain import Constraints
from .kv_quant import KvQuant
from .sizing import Sizes
from .topology import Topology

DEFAULT_CONTEXT_WINDOW = 4096

if TYPE_CHECKING:
    from .vision import VisionModel


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    path: str
    context_window: int
    tool_format: str = "none"  # a registered ``formats`` name (detected at load)
    has_thinking: bool = False  # the tokenizer has ``<think>`` tags (mlx-lm's has_thinking)
    constraints: Constraints | None = None
    # A vision-language model's image side (mlx-vlm; ``vision.py``); None: text-only.
    vision: VisionModel | None = None

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return ("text", "image") if self.vision is not None else ("text",)

    # The OpenBLAS thread count the generation thread set (None: OpenBLAS does not compute).
    blas: BlasThreads | None = None
    # MLX's version and default device in words, asked once here on the generation thread
    # (the only thread that calls MLX), so the start-up line and /status never call it.
    device: str = ""
    # The ranks the model is split over (None: one process holds it all).
    topology: Topology | None = None
    # The batch's sizes the generation thread chose (flags, else the device's: ``sizing.py``).
    sizes: Sizes | None = None
    # --kv-bits: what every sequence's plain KV layers are quantized to (kv_cache.py).
    kv_quant: KvQuant | None = None


def resolve_model_path(path_or_id: str) -> str:
    """A local folder stays as given; anything else is handed to mlx-lm as a hub id."""
    candidate = Path(path_or_id).expanduser()
    return str(candidate.resolve()) if candidate.exists() else path_or_id


def read_context_window(path: str) -> int:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return DEFAULT_CONTEXT_WINDOW
    config: Mapping[str, Any] = json.loads(config_file.read_text())
    # Multimodal checkpoints (Gemma 3/4, Qwen-VL, ...) keep the language model's settings in a
    # nested text_config; a top-level value still wins where both exist.
    nested = config.get("text_config")
    for source in (config, nested if isinstance(nested, Mapping) else {}):
        for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return DEFAULT_CONTEXT_WINDOW


def read_tool_parser_type(path: str) -> str | None:
    """``tokenizer_config.json``'s ``tool_parser_type`` (mlx-lm's key), or None."""
    config_file = Path(path) / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except ValueError:
        return None
    named = config.get("tool_parser_type") if isinstance(config, dict) else None
    return named if isinstance(named, str) and named else None


def _mlx_lm_knows(parser_type: str) -> bool:
    from importlib.util import find_spec

    return find_spec(f"mlx_lm.tool_parsers.{parser_type}") is not None


def detect_format(tokenizer: Any, tool_parser_type: str | None) -> formats.Format:
    """The output format of a loaded tokenizer (``formats.detect``)."""
    template = getattr(tokenizer, "chat_template", None)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return formats.detect(
        formats.Detection(
            template if isinstance(template, str) else "",
            frozenset(vocab),
            tool_parser_type,
        )
    )


def writes_reasoning(tokenizer: Any) -> bool:
    """Whether the model reasons: mlx-lm found thinking tokens in the vocabulary and the chat
    template writes them. A vocabulary shared across a family keeps ``<think>`` in models that
    never reason (Qwen3-Coder's template has no reasoning at all)."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    start = getattr(tokenizer, "think_start", None)
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(start, str) or not isinstance(template, str):
        return True
    return start in template


def load_model(path: str, split: Callable[[Any], None] | None = None) -> LoadedModel:
    """``split``: called on the lazily loaded model before its weights are read, to keep only
    this rank's share of them (``distributed.shard_model``)."""
    from mlx_lm import load

    parser_type = read_tool_parser_type(path)
    # mlx-lm imports a parser module for the named type: a name only this server knows
    # (``harmony``, ``hermes``) would fail its load, so mlx-lm is told none and infers.
    hidden = parser_type is not None and not _mlx_lm_knows(parser_type)
    model, tokenizer = load(
        path,
        tokenizer_config={"tool_parser_type": None} if hidden else None,
        lazy=split is not None,
    )[:2]
    if split is not None:
        import mlx.core as mx

        split(model)
        mx.eval(model.parameters())
    try:
        constraints: Constraints | None = Constraints(tokenizer)
    except (TypeError, ValueError):
        constraints = None  # a slow tokenizer: no constrained decoding (documented)
    from .vision import is_vision_model, load_vision

    folder = _local_folder(path)
    vision = None
    if folder is not None and is_vision_model(folder):
        vision = load_vision(folder, model)
    return LoadedModel(
        model,
        tokenizer,
        path,
        read_context_window(path),
        tool_format=detect_format(tokenizer, parser_type).name,
        has_thinking=writes_reasoning(tokenizer),
        constraints=constraints,
        vision=vision,
        device=device_words(),
    )


def _local_folder(path: str) -> str | None:
    """The folder mlx-lm loaded ``path`` from (a hub id's snapshot; it keeps every JSON file,
    so an image processor's config too)."""
    if Path(path).is_dir():
        return path
    try:
        from mlx_lm.utils import _download

        return str(_download(path))
    except Exception:
        return None


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
