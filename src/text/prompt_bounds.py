"""Cheap refusals: a prompt that cannot fit the context window is refused before it is tokenized.

Tokenizing is the expensive part of refusing an over-long request: a 24 MiB ``instructions``
made the tokenizer take gigabytes and tens of CPU seconds only to answer
``context_length_exceeded``. Counting bytes is linear and needs no extra memory, and for the
tokenizers this module recognises a byte count gives a *sound* lower bound on the token count:

    every token stands for at most ``max_token_bytes`` bytes of the (normalized) text, and the
    tokens together cover all of it, so ``tokens >= ceil(text_bytes / max_token_bytes)``.

Invariants:
- Sound: :func:`render_within` refuses (raises :class:`PromptTooLong`) only when the bound
  proves the prompt has more than ``max_tokens`` tokens; anything it admits is tokenized exactly
  as ``loader.render_prompt`` tokenizes it (the same template text, encoded without added
  special tokens), so an accepted prompt is unchanged.
- The bound is used only for tokenizers whose tokens cover every byte of the text: a
  ``tokenizers`` BPE model that is byte-level (a ``ByteLevel`` pre-tokenizer) or has
  ``byte_fallback``, with a normalizer made only of steps that cannot make the text shorter
  than this module measures it (Unicode normal forms, ``Lowercase``, ``Prepend``, a one-character
  ``Replace``). For any other tokenizer (WordPiece's ``[UNK]`` for a whole word, Unigram, a
  slow tokenizer) :func:`measure_tokenizer` returns ``None`` and every prompt is tokenized.
- ``max_token_bytes`` counts what a token stands for: for a byte-level vocabulary one byte per
  character of the token's string; otherwise the token string's UTF-8 length (an upper bound:
  ``▁`` is 3 bytes for one space, ``<0x0A>`` 6 for one byte); for an added token (special
  tokens such as ``<|im_start|>``, matched in the raw text) its content's UTF-8 length.
- The text measured is the rendered template passed through the tokenizer's own normalizer
  (ASCII text needs no normalizing: every recognised step keeps ASCII's length or grows it).
- Past the byte bound, a long prompt (over ``PIECES_ABOVE`` characters) is bounded by its
  words when the pre-tokenizer is a known word-splitting regex (``TokenBound.at_least_words``:
  every piece is a token and no piece holds two words), which refuses ordinary text about a
  quarter over the window without tokenizing; then it is tokenized in pieces: the tokenizer splits on its added
  tokens (``<|im_start|>``, ``<|im_end|>``) before anything else and handles the pieces between
  them independently, so the pieces' counts add up to the whole's exactly, and counting stops
  as soon as the sum is over the limit. Only for added tokens matched as plain strings (no
  ``lstrip``/``rstrip``/``single_word``/``normalized``); otherwise the prompt is tokenized whole.
  A piece is at most one message, so a single huge message is still tokenized in one go.
- Pure functions, run on a worker thread by the model handle (tokenizer only, no MLX).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tokenizers import Tokenizer

__all__ = ["PIECES_ABOVE", "PromptTooLong", "TokenBound", "measure_tokenizer", "render_within"]

# A rendered prompt longer than this (in characters) that the byte bound did not refuse is
# counted piece by piece first, so an over-long multi-turn prompt stops early.
PIECES_ABOVE: Final = 256 * 1024

# Normalizer steps that never make the text shorter than the bytes counted here (see above).
_SAFE_NORMALIZERS: Final = frozenset(
    {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Replace", "Sequence"}
)


def _byte_level_alphabet() -> frozenset[str]:
    """GPT-2's ``bytes_to_unicode``: the 256 characters a ``ByteLevel`` text is spelled in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = [b for b in range(256) if b not in printable]
    return frozenset([chr(b) for b in printable] + [chr(256 + n) for n in range(len(extra))])


_BYTE_LEVEL_ALPHABET: Final = _byte_level_alphabet()
# Maximal runs of ASCII letters and non-ASCII characters, and of non-ASCII characters only
# (no ASCII letter before or after): linear-time (the lookbehind pins each run's start).
_RUN_CHARS: Final = "A-Za-z\x80-\U0010ffff"
_ALL_RUNS: Final = re.compile(f"(?<![{_RUN_CHARS}])[{_RUN_CHARS}]++")
_NON_ASCII_RUNS: Final = re.compile(f"(?<![{_RUN_CHARS}])[\x80-\U0010ffff]++(?![{_RUN_CHARS}])")
# Split regexes whose pieces hold letters only as one contiguous run of letters (after at most
# one non-letter) or as a contraction: GPT-2 (ByteLevel's own), Llama 3 / cl100k, Qwen 2.
_WORD_REGEXES: Final = frozenset(
    {
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    }
)
_BYTE_FALLBACK_TOKENS: Final = frozenset(f"<0x{b:02X}>" for b in range(256))


class PromptTooLong(Exception):
    """The rendered prompt provably has more than ``max_tokens`` tokens."""

    def __init__(self, at_least: int, max_tokens: int) -> None:
        super().__init__(f"the prompt has at least {at_least} tokens, more than {max_tokens}")
        self.at_least = at_least
        self.max_tokens = max_tokens


@dataclass(frozen=True, slots=True)
class TokenBound:
    """What one tokenizer's token can stand for, and how to measure text as it sees it."""

    max_token_bytes: int
    normalizer: Any  # a ``tokenizers`` normalizer (``normalize_str``), or None
    # The added tokens (``<|im_start|>`` ...) as one leftmost-longest pattern, when splitting
    # the text at them and tokenizing the pieces apart counts exactly what the whole does.
    added: re.Pattern[str] | None = None
    # The pre-tokenizer is one of the GPT-2 / Llama 3 / Qwen 2 regexes, whose pieces never hold
    # letters of two different words (see ``at_least_words``).
    words: bool = False

    def at_least_words(self, text: str) -> int | None:
        """A lower bound on the token count from the words of ``text``; ``None`` if unknown.

        A *word* here is a maximal run of ASCII letters and non-ASCII characters that holds at
        least one ASCII letter. The known regexes put letters in pieces only as one contiguous
        run of letters (plus one non-letter prefix) or a contraction, so no piece holds ASCII
        letters of two words, and every piece is at least one token: tokens >= words. Treating
        every non-ASCII character as a possible letter keeps this true whatever Unicode version
        the tokenizer's regex knows. Added tokens are one token each; the words inside their
        text (``im``, ``start``) are taken back off (merging across them only lowers the count).
        """
        if not self.words or self.added is None:
            return None
        if not text.isascii() and self.normalizer is not None:
            text = self.normalizer.normalize_str(text)
        words = _ALL_RUNS.subn("", text)[1] - _NON_ASCII_RUNS.subn("", text)[1]
        for match in self.added.finditer(text):
            inside = match.group()
            words -= _ALL_RUNS.subn("", inside)[1] - _NON_ASCII_RUNS.subn("", inside)[1] - 1
        return max(words, 0)

    def count_in_pieces(
        self, encode: Callable[[str], Sequence[int]], text: str, max_tokens: int
    ) -> int | None:
        """The exact token count of ``text``, tokenized piece by piece between added tokens
        (each piece bounded by a message, not the whole prompt); stops early and returns the
        count so far once it exceeds ``max_tokens``. ``None`` when pieces are not exact."""
        if self.added is None:
            return None
        count = 0
        start = 0
        for match in self.added.finditer(text):
            if match.start() > start:
                count += len(encode(text[start : match.start()]))
            count += 1
            start = match.end()
            if count > max_tokens:
                return count
        if start < len(text):
            count += len(encode(text[start:]))
        return count

    def text_bytes(self, text: str) -> int:
        """The UTF-8 length of ``text`` after the tokenizer's normalizer."""
        if text.isascii():
            return len(text)
        if self.normalizer is not None:
            text = self.normalizer.normalize_str(text)
        return len(text.encode("utf-8", "surrogatepass"))

    def at_least_tokens(self, text: str) -> int:
        """A lower bound on the number of tokens ``text`` encodes to."""
        return -(-self.text_bytes(text) // self.max_token_bytes)


def _components(spec: Any, kind: str) -> Iterator[Mapping[str, Any]]:
    """The steps of a ``tokenizers`` normalizer / pre-tokenizer spec (flattening Sequence)."""
    if not isinstance(spec, Mapping):
        return
    yield spec
    for child in spec.get(kind, ()) or ():
        yield from _components(child, kind)


def _safe_normalizer(spec: Any) -> bool:
    if spec is None:
        return True
    for step in _components(spec, "normalizers"):
        kind = step.get("type")
        if kind not in _SAFE_NORMALIZERS:
            return False
        if kind == "Replace":
            pattern = step.get("pattern", {})
            literal = pattern.get("String") if isinstance(pattern, Mapping) else None
            content = step.get("content", "")
            if not isinstance(literal, str) or len(literal) != 1 or not content:
                return False  # a regex, or a multi-character pattern, could shrink the text
    return True


def _backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind an mlx-lm wrapper or a Hugging Face tokenizer."""
    for _ in range(3):
        if isinstance(tokenizer, Tokenizer):
            return tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if isinstance(backend, Tokenizer):
            return backend
        tokenizer = getattr(tokenizer, "_tokenizer", None)
    return None


def measure_tokenizer(tokenizer: Any) -> TokenBound | None:
    """The bound for an mlx-lm ``TokenizerWrapper`` (or a Hugging Face tokenizer); ``None``
    when this tokenizer's tokens are not known to cover every byte of the text."""
    backend = _backend(tokenizer)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
    except (TypeError, ValueError):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    byte_level = any(
        step.get("type") == "ByteLevel"
        for step in _components(spec.get("pre_tokenizer"), "pretokenizers")
    )
    if not (byte_level or model.get("byte_fallback")):
        return None
    if not _safe_normalizer(spec.get("normalizer")) or model.get("fuse_unk"):
        return None
    vocab = model.get("vocab") or {}
    if not isinstance(vocab, Mapping) or not vocab:
        return None
    # Without an unknown token, a byte missing from the vocabulary would be dropped silently.
    alphabet = _BYTE_LEVEL_ALPHABET if byte_level else _BYTE_FALLBACK_TOKENS
    if model.get("unk_token") is None and not alphabet.issubset(vocab):
        return None
    if byte_level:
        longest = max(len(token) for token in vocab)
    else:
        longest = max(len(token.encode("utf-8", "surrogatepass")) for token in vocab)
    added_tokens = spec.get("added_tokens") or ()
    for added in added_tokens:
        content = added.get("content", "")
        longest = max(longest, len(content.encode("utf-8", "surrogatepass")))
    return TokenBound(
        max(longest, 1),
        backend.normalizer,
        _added_pattern(added_tokens),
        _splits_words(spec.get("pre_tokenizer")),
    )


def _splits_words(spec: Any) -> bool:
    """Whether the pre-tokenizer splits with a known word regex before anything rewrites the
    text (later steps only split further, which never joins words)."""
    for step in _components(spec, "pretokenizers"):
        kind = step.get("type")
        if kind == "Split":
            pattern = step.get("pattern")
            regex = pattern.get("Regex") if isinstance(pattern, Mapping) else None
            if (
                regex in _WORD_REGEXES
                and step.get("behavior") == "Isolated"
                and not step.get("invert")
            ):
                return True
        elif kind == "ByteLevel":
            return bool(step.get("use_regex", True))  # GPT-2's regex, on the text as given
        elif kind == "Metaspace":
            return False  # rewrites the text
    return False


def _added_pattern(added_tokens: Sequence[Mapping[str, Any]]) -> re.Pattern[str] | None:
    """The added tokens as the tokenizer splits on them, or ``None`` if pieces would not be
    exact: a token that strips whitespace around it, matches whole words only, or is matched
    after normalization could split differently from a plain leftmost-longest search."""
    contents: list[str] = []
    for added in added_tokens:
        content = added.get("content")
        if not isinstance(content, str) or not content:
            return None
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            return None
        if added.get("normalized"):
            return None
        contents.append(content)
    if not contents:
        return None
    ordered = sorted(set(contents), key=len, reverse=True)  # longest first at each position
    return re.compile("|".join(re.escape(content) for content in ordered))


def render_within(
    tokenizer: Any,
    bound: TokenBound | None,
    max_tokens: int,
    chat: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    *,
    pieces_above: int = PIECES_ABOVE,
) -> list[int]:
    """``loader.render_prompt``, but refused with :class:`PromptTooLong` before tokenizing
    when the rendered text provably has more than ``max_tokens`` tokens: by its byte count, or
    (a text longer than ``pieces_above`` characters) by tokenizing it message by message and
    stopping once the count is over."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in chat],
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=False,
        **dict(template_kwargs or {}),
    )

    def encode(piece: str) -> Sequence[int]:
        return tokenizer.encode(piece, add_special_tokens=False)  # type: ignore[no-any-return]

    if bound is not None:
        at_least = bound.at_least_tokens(text)
        if at_least > max_tokens:
            raise PromptTooLong(at_least, max_tokens)
        if len(text) > pieces_above:
            words = bound.at_least_words(text)
            if words is not None and words > max_tokens:
                raise PromptTooLong(words, max_tokens)
            counted = bound.count_in_pieces(encode, text, max_tokens)
            if counted is not None and counted > max_tokens:
                raise PromptTooLong(counted, max_tokens)
    return [int(t) for t in encode(text)]
