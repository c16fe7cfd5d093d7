"""Constrained decoding: llguidance grammars applied to mlx-lm logits, on CPU with plain mx ops.

Invariants:
- One ``Constraints`` per loaded tokenizer. It owns the llguidance tokenizer (built once) and a
  small LRU cache of compiled grammars. Its public methods touch no MLX state, so any thread may
  call them, also concurrently (the cache is behind a lock; compiling happens outside it).
- A ``Grammar`` is immutable: it holds a compiled prototype ``LLMatcher`` that is never advanced.
  Each sequence gets a deep copy (microseconds), so one grammar serves any number of sequences.
- ``make_logits_processor`` returns a processor for exactly one sequence, created and called on
  the MLX generation thread. Its first call sees the prompt only: it records the prompt's length.
  Every later call feeds the matcher ``tokens[prompt_len + consumed:]``, the tokens sampled since
  the previous call (one, in mlx-lm's generators). If ``tokens`` shrinks (a speculative rollback),
  the matcher rolls back by as much.
- The processor returns logits of the input's shape and dtype in which every token the grammar
  forbids is ``-inf``. Ids the llguidance tokenizer does not know (padding rows of a model's output
  layer) are always forbidden.
- Once the grammar is complete, or if the matcher is in error (it was fed a token its mask forbade,
  e.g. by a sampler that ignored the mask), only the end-of-turn/EOS tokens are allowed, so the
  sequence ends in at most one more token. The EOS set is the tokenizer wrapper's
  ``eos_token_ids``, the ids mlx-lm stops on.
- JSON is generated compactly with ``", "`` and ``": "`` separators and no other whitespace (what
  ``json.dumps`` and the Hermes tool-call format write), so whitespace can never run on forever.
- ``strict=True`` makes schema keywords llguidance does not implement (``uniqueItems``, ``not``,
  ``if``/``then``...) an ``InvalidSchema``; ``strict=False`` ignores them (the output still
  follows every keyword llguidance implements).

The bitmask llguidance computes (one bit per token, in uint32 words) is unpacked with numpy
(``unpackbits``, little bit order: bit ``i`` of the mask is token ``i``) into a boolean array and
applied with ``mx.where``; the Metal-only kernel in ``llguidance.mlx`` is not used (numpy's unpack
measured faster on CPU than MLX shifts: ``bench/constrained.py``). Where the mask is costly (a
vocabulary of 32k tokens or more) or the model runs on a GPU, the processor first starts evaluating
the logits (``mx.async_eval``) so that the forward pass and the mask computation overlap; with a
small vocabulary on CPU that extra launch costs more than it hides.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from .. import formats
from ..formats.grammars import (
    InvalidSchema,
    ToolGrammarBuilder,
    json_schema_grammar,
    validate_grammar,
)
from ..protocol.decoding import Decoding

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "CannotConstrain",
    "Constraints",
    "Grammar",
    "InvalidSchema",
    "make_logits_processor",
]

log = logging.getLogger(__name__)

_CACHE_SIZE = 128
# From this vocabulary size up, overlap the forward pass with the mask computation.
_OVERLAP_MIN_VOCAB = 32_768


class CannotConstrain(Exception):
    """A decoding rule that could not be compiled: its schema or tools are invalid
    (``invalid_schema``, the cause an ``InvalidSchema``), or this model cannot follow it."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.invalid_schema = isinstance(cause, InvalidSchema)


@dataclass(frozen=True)
class Grammar:
    """An immutable compiled grammar; ``make_logits_processor`` instantiates it per sequence.

    ``kind`` is ``"json_schema"``, ``"json_object"`` or ``"tool_call"``; ``source`` is the
    llguidance grammar text (for logs and debugging); ``warnings`` are llguidance's notes, e.g. the
    keywords a non-strict schema had that were ignored.
    """

    kind: str
    source: str
    warnings: tuple[str, ...] = ()
    _prototype: LLMatcher = field(repr=False, compare=False, kw_only=True)
    _tokenizer: LLTokenizer = field(repr=False, compare=False, kw_only=True)

    def new_matcher(self) -> LLMatcher:
        """A fresh matcher in the start state (a deep copy of the never-advanced prototype)."""
        return self._prototype.deep_copy()


class Constraints:
    """Built once per loaded tokenizer (the mlx-lm TokenizerWrapper); thread-safe to call from any
    non-MLX thread.

    ``tokenizer`` is mlx-lm's ``TokenizerWrapper`` (or a Hugging Face fast tokenizer, then the EOS
    set is its ``eos_token_id``). Building the llguidance tokenizer takes ~10 ms at the bundled
    model's 588 tokens and ~2-3 s at 150k (2-core machine): build it once, at model load.
    """

    def __init__(self, tokenizer: Any) -> None:
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise TypeError("constrained decoding needs a fast (Rust `tokenizers`) tokenizer")
        # As llguidance.hf.from_tokenizer does: serialize a copy without padding/truncation (the
        # serialized form includes added tokens).
        backend = copy.copy(backend)
        backend.no_padding()
        backend.no_truncation()
        eos = _eos_ids(tokenizer, hf)
        self._ll = LLTokenizer(backend.to_str(), eos_token=eos)
        self.vocab_size: int = self._ll.vocab_size
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        self._tools = ToolGrammarBuilder(self._ll, _token_lookup(hf))
        self._cache: OrderedDict[tuple[str, ...], Grammar] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> LLTokenizer:
        return self._ll

    def json_schema(self, schema: Mapping[str, Any], *, strict: bool = True) -> Grammar:
        """Output is one JSON value valid against ``schema``. Raises ``InvalidSchema``."""
        if not isinstance(schema, Mapping):
            raise InvalidSchema("the JSON schema must be an object")
        key = ("json_schema", _canonical(schema, "the JSON schema"), str(strict))
        return self._cached(
            key, lambda: self._compile("json_schema", json_schema_grammar(schema, strict=strict))
        )

    def json_object(self) -> Grammar:
        """Output is one JSON object (any keys and values)."""
        return self._cached(
            ("json_object",),
            lambda: self._compile("json_object", json_schema_grammar({"type": "object"})),
        )

    def tool_call(
        self, tools: Sequence[Mapping[str, Any]], *, name: str | None, tool_format: str
    ) -> Grammar:
        """Output is exactly one call, in ``tool_format`` (a ``formats`` name), of ``name`` or
        of any of ``tools``, whose arguments match that tool's ``parameters`` (a custom tool,
        ``{"type": "custom", ...}``: its format); then the end of the turn.

        A format without a ``call_grammar`` (or an unknown name) raises
        ``NotImplementedError``. Bad tools or an unknown ``name`` raise ``InvalidSchema``.
        """
        key = ("tool_call", _canonical(list(tools), "tools"), name or "", tool_format)

        def build() -> Grammar:
            try:
                fmt = formats.get(tool_format)
            except formats.UnknownFormat as exc:
                raise NotImplementedError(str(exc)) from None
            source = self._tools.build(tools, name, fmt.name, fmt.call_grammar)
            return self._compile("tool_call", source)

        return self._cached(key, build)

    def follow(self, decoding: Decoding, tool_format: str) -> Grammar:
        """The grammar of a request's decoding rule (``protocol/decoding.py``), a tool call in
        ``tool_format``; raises as ``tool_call`` and ``json_schema`` do."""
        match decoding.kind:
            case "tool_call":
                return self.tool_call(decoding.tools, name=decoding.name, tool_format=tool_format)
            case "json_schema":
                return self.json_schema(decoding.schema, strict=decoding.strict)
            case "json_object":
                return self.json_object()

    def from_source(self, kind: str, source: str) -> Grammar:
        """The grammar compiled from its llguidance text: how the generation thread gets the
        grammar a sequence names (a cache hit for one compiled here by its schema or tools)."""
        return self._cached(("source", source), lambda: self._compile(kind, source))

    # -- internals -----------------------------------------------------------------------------

    def _cached(self, key: tuple[str, ...], build: Callable[[], Grammar]) -> Grammar:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        grammar = build()  # outside the lock: compiling can take a while (it drops the GIL)
        with self._lock:
            self._cache[key] = grammar
            self._cache.move_to_end(key)
            self._cache[("source", grammar.source)] = grammar  # what ``from_source`` finds
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def _compile(self, kind: str, source: str) -> Grammar:
        warnings = validate_grammar(source, self._ll)
        prototype = LLMatcher(self._ll, source, log_level=0)
        if prototype.is_error():
            raise InvalidSchema(prototype.get_error().split("\n", 1)[0])
        return Grammar(kind, source, warnings, _prototype=prototype, _tokenizer=self._ll)


def make_logits_processor(constraints: Constraints, grammar: Grammar) -> Callable[[Any, Any], Any]:
    """A fresh processor for one sequence; create and call it on the MLX generation thread."""
    if grammar._tokenizer is not constraints.ll_tokenizer:
        raise ValueError("the grammar was compiled by another Constraints (another tokenizer)")
    return _Processor(constraints, grammar.new_matcher())


class _Processor:
    """``fn(tokens, logits) -> logits`` holding one sequence's matcher (see the module header)."""

    __slots__ = (
        "_buffer",
        "_consumed",
        "_eos",
        "_eos_mask",
        "_failed",
        "_matcher",
        "_mx",
        "_overlap",
        "_prompt_len",
        "_unfed",
        "_vocab",
        "_width",
    )

    def __init__(self, constraints: Constraints, matcher: LLMatcher) -> None:
        import mlx.core as mx  # only here: the grammar side of this module needs no MLX

        self._mx = mx
        self._overlap = (
            constraints.vocab_size >= _OVERLAP_MIN_VOCAB
            or mx.default_device().type != mx.DeviceType.cpu
        )
        self._matcher = matcher
        self._vocab = constraints.vocab_size
        # One bit per token, rounded up to whole uint32 words; llguidance writes it in place.
        self._buffer: NDArray[np.uint8] = np.zeros(((self._vocab + 31) // 32) * 4, dtype=np.uint8)
        self._eos = frozenset(constraints.eos_token_ids)
        self._prompt_len = -1
        self._consumed = 0
        self._unfed = 0  # trailing EOS tokens seen after the grammar completed
        self._failed = False
        self._width = -1  # the logits' last dimension, known at the first call
        self._eos_mask: Any = None

    def __call__(self, tokens: Any, logits: Any) -> Any:
        mx = self._mx
        if self._overlap:
            # Start the forward pass now: it runs while llguidance computes the mask below.
            mx.async_eval(logits)
        if tokens.ndim > 1:
            tokens = tokens.reshape(-1)
        n = int(tokens.shape[0])
        if self._prompt_len < 0:
            self._prompt_len = n
            self._width = int(logits.shape[-1])
            eos = np.zeros(self._width, dtype=np.bool_)
            eos[[t for t in self._eos if t < self._width]] = True
            self._eos_mask = mx.array(eos)
        else:
            self._advance(tokens, n)
        return mx.where(self._mask(), logits, -mx.inf)

    def _advance(self, tokens: Any, n: int) -> None:
        start = self._prompt_len + self._consumed
        if n < start:  # the caller rolled tokens back (speculative decoding)
            back = start - n
            self._consumed -= back
            unfed = min(back, self._unfed)
            self._unfed -= unfed
            if not self._failed and back > unfed:
                self._matcher.rollback(back - unfed)
            return
        if n == start:
            return
        new: list[int] = tokens[start:].tolist()
        self._consumed += len(new)
        matcher = self._matcher
        for token in new:
            if self._failed:
                return
            if token in self._eos and matcher.is_stopped():
                # mlx-lm computes one step past the end of turn (its pipelining): the complete
                # grammar has nothing to consume it with.
                self._unfed += 1
            elif not matcher.consume_token(token):
                self._failed = True
                log.warning(
                    "constrained decoding: token %d is outside the grammar (%s); "
                    "only end of turn is allowed from here",
                    token,
                    matcher.get_error().split("\n", 1)[0],
                )

    def _mask(self) -> Any:
        matcher = self._matcher
        if self._failed or matcher.is_stopped():
            return self._eos_mask
        buffer = self._buffer
        matcher.unsafe_compute_mask_ptr(buffer.ctypes.data, buffer.nbytes)
        bits = np.unpackbits(buffer, bitorder="little", count=min(self._width, self._vocab))
        if self._width > bits.shape[0]:
            bits = np.concatenate([bits, np.zeros(self._width - bits.shape[0], dtype=np.uint8)])
        return self._mx.array(bits.view(np.bool_))


# -- helpers ---------------------------------------------------------------------------------


def _eos_ids(wrapper: Any, hf: Any) -> list[int]:
    ids: set[int] = set()
    wrapped = getattr(wrapper, "eos_token_ids", None)
    if wrapped:
        ids.update(int(t) for t in wrapped)
    elif getattr(hf, "eos_token_id", None) is not None:
        ids.add(int(hf.eos_token_id))
    if not ids:
        raise ValueError("the tokenizer names no end-of-sequence token")
    return sorted(ids)


def _token_lookup(hf: Any) -> Callable[[str], int | None]:
    """A token's id by its exact text (added tokens included), or None."""
    vocab: dict[str, int] = dict(hf.get_vocab())

    def lookup(text: str) -> int | None:
        return vocab.get(text)

    return lookup


def _canonical(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSchema(f"{what} is not valid JSON: {exc}") from None
