"""The model actor's settings and request types (imported from ``actors.model``).

Invariants:
- Frozen values; nothing here runs or holds MLX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..model.constrain import Grammar
from ..model.penalties import SamplingAdjust
from ..model.prompt_cache import DEFAULT_MAX_ENTRIES
from ..model.stream_parse import ToolFormat
from ..model.thread import GenerationThread

ThreadFactory = Callable[..., GenerationThread]


class ModelUnavailable(RuntimeError):
    """The model is shutting down or has stopped; no new sequence is admitted."""


class ModelOverloaded(RuntimeError):
    """Too many sequences are admitted already."""


@dataclass(frozen=True, slots=True)
class ModelSettings:
    model_path: str
    alias: str
    prefill_step_size: int = 512
    completion_batch_size: int = 32
    prefill_batch_size: int = 8
    max_sequences: int = 256
    # --ctx-size: the context window the server enforces and compaction plans with; None: the
    # model's own (its config's max_position_embeddings or the like).
    context_size: int | None = None
    # --prompt-cache-bytes (None: a fraction of the machine's memory; 0 disables) and
    # --prompt-cache-entries.
    prompt_cache_bytes: int | None = None
    prompt_cache_entries: int = DEFAULT_MAX_ENTRIES
    # --blas-threads (None: measured at load, model.blas_threads).
    blas_threads: int | None = None
    # The seam for fault injection: tests install a GenerationThread subclass here.
    thread_factory: ThreadFactory = GenerationThread


@dataclass(frozen=True, slots=True)
class ModelInfo:
    alias: str
    path: str
    context_window: int
    tool_format: ToolFormat = "none"
    has_thinking: bool = False


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A rendered prompt and its sampling settings."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int | None = None
    seed: int | None = None
    # The grammar its output must follow (compiled by ``ModelHandle.compile``).
    grammar: Grammar | None = None
    # Penalties and top_k (logits processors the generation thread builds).
    adjust: SamplingAdjust = field(default_factory=SamplingAdjust)
    # Text that ends the sequence with ``stop`` when generated (the matched text is not output).
    stop_texts: tuple[str, ...] = ()
    # The tenant (decision 12): scopes the prompt cache.
    owner: str = ""
    # The request's prompt_cache_key: the prompt-cache partition its entries are kept in.
    cache_key: str | None = None
