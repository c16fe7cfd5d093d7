"""The cheap-refusal bound is sound (never more than the real token count) and an admitted
prompt is tokenized exactly as before; tokenizers it cannot vouch for get no bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm import load
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE, WordPiece
from transformers import PreTrainedTokenizerFast

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH, load_bundled_prompts
from mlx_responses.engine.loader import render_prompt
from mlx_responses.text.prompt_bounds import (
    PromptTooLong,
    TokenBound,
    measure_tokenizer,
    render_within,
)


@pytest.fixture(scope="module")
def bundled() -> Any:
    return load(str(BUNDLED_MODEL_PATH))[1]


@pytest.fixture(scope="module")
def bundled_bound(bundled: Any) -> TokenBound:
    bound = measure_tokenizer(bundled)
    assert bound is not None  # byte-level BPE with an NFC normalizer: recognised
    return bound


def sentencepiece_like() -> PreTrainedTokenizerFast:
    """A Llama-2-style tokenizer: BPE with byte fallback, ``▁`` for spaces."""
    vocab = {"<unk>": 0, "<s>": 1, "▁": 2, "a": 3, "b": 4, "▁a": 5, "ab": 6, "▁ab": 7}
    vocab.update({f"<0x{b:02X}>": 8 + b for b in range(256)})
    model = BPE(vocab, [("a", "b"), ("▁", "a"), ("▁", "ab")], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.decoder = decoders.ByteFallback()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_only_tokenizers_whose_tokens_cover_the_text_get_a_bound() -> None:
    assert measure_tokenizer(sentencepiece_like()) is not None
    wordpiece = Tokenizer(WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    assert measure_tokenizer(PreTrainedTokenizerFast(tokenizer_object=wordpiece)) is None
    # A byte-level vocabulary missing bytes and without an unknown token drops them: no bound.
    partial = Tokenizer(BPE({"a": 0}, []))
    partial.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert measure_tokenizer(PreTrainedTokenizerFast(tokenizer_object=partial)) is None
    strip = Tokenizer(BPE({"a": 0}, [], unk_token="a", byte_fallback=True))
    strip.normalizer = normalizers.Strip()
    assert measure_tokenizer(PreTrainedTokenizerFast(tokenizer_object=strip)) is None
    assert measure_tokenizer(object()) is None


_piece = st.characters(codec="utf-8") | st.sampled_from(
    ["e\u0301", "\u1100\u1161\u11a8", "<|im_start|>", "<|im_end|>", "\n", " "]
)
_text = st.lists(_piece, max_size=100).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_text)
def test_the_bound_never_exceeds_the_real_count(
    bundled: Any, bundled_bound: TokenBound, text: str
) -> None:
    real = len(bundled.encode(text, add_special_tokens=False))
    assert bundled_bound.at_least_tokens(text) <= real


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.sampled_from("ab é\u0301\n日😀"), max_size=200))
def test_the_bound_holds_for_byte_fallback(text: str) -> None:
    tokenizer = sentencepiece_like()
    bound = measure_tokenizer(tokenizer)
    assert bound is not None
    assert bound.at_least_tokens(text) <= len(tokenizer.encode(text, add_special_tokens=False))


def test_admitted_prompts_are_tokenized_exactly_as_before(
    bundled: Any, bundled_bound: TokenBound
) -> None:
    for prompt in load_bundled_prompts():
        chat = prompt.messages
        tools = prompt.tools
        exact = render_prompt(bundled, chat, tools)
        # The tightest limit that still admits it.
        assert render_within(bundled, bundled_bound, len(exact), chat, tools) == exact
        assert render_within(bundled, None, 1, chat, tools) == exact


def test_a_prompt_far_over_the_limit_is_refused_untokenized(
    bundled: Any, bundled_bound: TokenBound
) -> None:
    chat = [{"role": "user", "content": "word " * 50_000}]
    with pytest.raises(PromptTooLong) as refused:
        render_within(bundled, bundled_bound, 2047, chat)
    real = len(render_prompt(bundled, chat))
    assert 2047 < refused.value.at_least <= real


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_text)
def test_pieces_between_added_tokens_count_exactly(
    bundled: Any, bundled_bound: TokenBound, text: str
) -> None:
    def encode(piece: str) -> list[int]:
        return list(bundled.encode(piece, add_special_tokens=False))

    assert bundled_bound.count_in_pieces(encode, text, 10**9) == len(encode(text))


def test_a_long_conversation_is_refused_piece_by_piece(
    bundled: Any, bundled_bound: TokenBound
) -> None:
    # ~20 KiB of words: under the byte bound (2047 x 16 bytes), but ~5000 tokens.
    chat = [{"role": "user" if i % 2 else "assistant", "content": "word " * 400} for i in range(10)]
    real = len(render_prompt(bundled, chat))
    assert bundled_bound.at_least_tokens("word " * 4000) <= 2047 < real
    with pytest.raises(PromptTooLong) as refused:
        render_within(bundled, bundled_bound, 2047, chat, pieces_above=0)
    assert 2047 < refused.value.at_least <= real
    # What fits is still tokenized whole, exactly.
    assert render_within(bundled, bundled_bound, real, chat, pieces_above=0) == render_prompt(
        bundled, chat
    )


_wordy = st.lists(
    st.characters(codec="utf-8")
    | st.sampled_from(
        [
            "word",
            " the",
            "it's",
            "\u212a",
            "\uff41\uff42",
            "e\u0301",
            "日本語",
            "—,—",
            "<|im_start|>",
            "\n",
            "42",
        ]
    ),
    max_size=80,
).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_wordy)
def test_the_word_bound_never_exceeds_the_real_count(
    bundled: Any, bundled_bound: TokenBound, text: str
) -> None:
    assert bundled_bound.words  # Qwen 2's regex
    words = bundled_bound.at_least_words(text)
    assert words is not None
    assert words <= len(bundled.encode(text, add_special_tokens=False))


def test_ordinary_text_over_the_window_is_refused_by_its_words(
    bundled: Any, bundled_bound: TokenBound
) -> None:
    text = "the quick brown fox jumps over the lazy dog " * 300  # 2700 words, 13 KiB
    chat = [{"role": "user", "content": text}]
    assert bundled_bound.at_least_tokens(text) < 2047  # the byte bound lets it through
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(bundled, name)

        def encode(self, piece: str, **kwargs: Any) -> Any:
            calls.append(piece)
            return bundled.encode(piece, **kwargs)

    with pytest.raises(PromptTooLong) as refused:
        render_within(Counting(), bundled_bound, 2047, chat, pieces_above=0)
    assert calls == []  # refused before any tokenization
    assert 2047 < refused.value.at_least <= len(render_prompt(bundled, chat))
