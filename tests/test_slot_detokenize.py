"""A slot that detokenizes on its consumer's side (``SequenceSlot.detokenize_with``) with the
bundled model's real tokenizer: the producer thread pushes token ids, and whatever the consumer's
delays and lingers split them into, the text is the one mlx-lm's streaming detokenizer makes of
them on one thread. (Apart from ``test_slot.py``, which stays free of mlx-lm.)"""

from __future__ import annotations

import functools
import threading
from typing import Any, cast

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.slot import FinishReason, SequenceSlot

from .test_slot import FINISHES, consume, wall_deadline


@functools.cache
def bundled_tokenizer() -> Any:
    from mlx_lm.tokenizer_utils import load

    return load(BUNDLED_MODEL_PATH)


def detokenized(ids: list[int], finish: FinishReason) -> str:
    """The text mlx-lm's streaming detokenizer makes of ``ids`` fed one at a time on one
    thread, finalized as the generation thread finalizes a stop or a length finish."""
    detokenizer = bundled_tokenizer().detokenizer
    for token in ids:
        detokenizer.add_token(token)
    if finish in ("stop", "length"):
        detokenizer.finalize()
    return cast(str, detokenizer.text)


@settings(max_examples=30, deadline=None)
@given(
    # The bundled tokenizer's ids, its byte tokens included: a character split over tokens
    # is held back until it is whole, whichever receive it falls in.
    ids=st.lists(st.integers(min_value=0, max_value=581), max_size=40),
    sentence=st.text(max_size=12),
    finish=st.sampled_from(FINISHES),
    delay=st.sampled_from([0.0, 0.0005, 0.002]),
    linger=st.sampled_from([0.0, 0.0005, 0.003]),
)
def test_token_ids_are_detokenized_by_the_consumer_into_the_same_text(
    ids: list[int], sentence: str, finish: FinishReason, delay: float, linger: float
) -> None:
    """A slot given a detokenizer takes token ids from the producer thread; whatever the
    consumer's delays and lingers split them into, its text is the one mlx-lm's detokenizer
    makes of them on one thread (``detokenized``)."""
    tokens = [*bundled_tokenizer().encode(sentence), *ids]

    async def main() -> None:
        slot = SequenceSlot(trio.lowlevel.current_trio_token())

        def produce() -> None:
            slot.detokenize_with(bundled_tokenizer().detokenizer)
            for token in tokens:
                slot.push(new_tokens=1, token=token)
            slot.push(finish=finish)
            slot.push(new_tokens=1, token=tokens[0] if tokens else 0)  # after: ignored

        producer = threading.Thread(target=produce)
        with wall_deadline(10):
            producer.start()
            text, count, finishes = await consume(slot, delay, linger)
        producer.join()
        assert text == detokenized(tokens, finish)
        assert count == len(tokens)
        assert finishes == [finish]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
