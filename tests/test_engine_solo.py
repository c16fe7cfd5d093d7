"""A sequence alone decodes outside mlx-lm's ``BatchGenerator`` (``batch.py``'s "solo"), and
goes back into it when another sequence comes: its tokens are the ones mlx-lm's generator gives
for the same prompt (greedy, token for token), whether it decoded alone all along, or alone,
then batched beside another, then alone again; no token is lost or repeated at a switch, its
log-probabilities are the batched path's, a cancel ends it at once, and its cache serves the
next turn. The real generation thread on the bundled model, driven through its inbound port."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio

from mlx_responses.cli import build_parser, settings_from_args
from mlx_responses.engine import batch as batch_module
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.inbound import (
    Admit,
    Cancel,
    ClearPromptCache,
    GrammarSpec,
    SequenceSpec,
    Shutdown,
    StopMatched,
)
from mlx_responses.engine.loader import LoadedModel
from mlx_responses.engine.outbound import FactStream, Loaded
from mlx_responses.engine.penalties import SamplingAdjust
from mlx_responses.engine.slot import SequenceSlot
from mlx_responses.engine.thread import GenerationThread, ThreadSettings

from .test_cli_operations import assert_flag_refused
from .test_engine_replay import DEADLINE, Engine, Transcript, ended_all, engine, read


def _loaded(model: Engine) -> LoadedModel:
    """The model the engine loaded (it reported ``Loaded`` before the test began)."""
    assert model.loaded is not None
    return model.loaded


def _prompt(loaded: LoadedModel, text: str) -> tuple[int, ...]:
    chat = [{"role": "user", "content": text}]
    rendered = loaded.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    return tuple(int(t) for t in rendered)


def _mlx_lm_text(loaded: LoadedModel, prompt: tuple[int, ...], max_tokens: int) -> str:
    """What mlx-lm's ``BatchGenerator`` generates for ``prompt`` alone, greedy (its own
    end-of-sequence tokens end it, as the server's do)."""
    from mlx_lm.generate import BatchGenerator, make_stop_sequences

    generator = BatchGenerator(loaded.model, max_tokens=max_tokens)
    detokenizer = loaded.tokenizer.detokenizer
    try:
        generator.insert(
            [list(prompt)],
            [max_tokens],
            stop_sequences=[make_stop_sequences(loaded.tokenizer)],
        )
        while True:
            _, responses = generator.next()
            for response in responses:
                if response.finish_reason == "stop":
                    detokenizer.finalize()
                    return str(detokenizer.text)
                detokenizer.add_token(response.token)
                if response.finish_reason is not None:
                    detokenizer.finalize()
                    return str(detokenizer.text)
    finally:
        generator.close()


def _logprob_tokens(transcript: Transcript) -> list[list[str]]:
    """Each generated token's text and its alternatives' texts, in order."""
    rows = []
    for entry in transcript.logprobs:
        assert isinstance(entry, dict)
        rows.append([entry["token"], *(top["token"] for top in entry["top_logprobs"])])
    return rows


def _logprob_rows(transcript: Transcript) -> list[float]:
    """Each generated token's log-probability and its alternatives', flattened in order."""
    values: list[float] = []
    for entry in transcript.logprobs:
        assert isinstance(entry, dict)
        values += [entry["logprob"], *(top["logprob"] for top in entry["top_logprobs"])]
    return values


def _totals(model: Engine) -> tuple[int, int]:
    """How many times a sequence went alone (out of the generator, or prefilled alone), and
    the steps taken alone."""
    batch = model.thread._batch
    assert batch is not None
    totals = batch.totals
    return totals.solo_entries + totals.solo_prefills, totals.solo_steps


def _prefills(model: Engine) -> int:
    """How many sequences were prefilled alone."""
    batch = model.thread._batch
    assert batch is not None
    return batch.totals.solo_prefills


async def _mlx_lm(model: Engine, prompt: tuple[int, ...], max_tokens: int) -> str:
    """The reference, computed on the generation thread's side of MLX: after the engine has
    shut down its batch nothing else uses the model, so a worker thread may."""
    loaded = _loaded(model)
    return await trio.to_thread.run_sync(_mlx_lm_text, loaded, prompt, max_tokens)


async def _answer(model: Engine, seq_id: int, spec: SequenceSpec) -> Transcript:
    """Admit ``spec`` as ``seq_id``, read it to its finish and wait for its end."""
    model.send(Admit(seq_id, spec))
    transcript = await read(model.slots[seq_id])
    await ended_all(model, {seq_id})
    return transcript


async def test_a_lone_sequence_decodes_alone_with_mlx_lm_s_tokens() -> None:
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        prompt = _prompt(loaded, "Count from 1 to 400.")
        with trio.fail_after(DEADLINE):
            alone = await _answer(model, 1, SequenceSpec(prompt, 120, 0.0, 1.0))
        entries, steps = _totals(model)
    assert alone.finish == "length"
    assert alone.tokens == 120
    assert entries == 1
    assert steps >= alone.tokens - 2  # all but its first token or two came from solo steps
    with trio.fail_after(DEADLINE):
        assert alone.text == await _mlx_lm(model, prompt, 120)


async def test_a_sequence_alone_then_batched_then_alone_loses_and_repeats_nothing() -> None:
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        long = _prompt(loaded, "Count from 1 to 400.")
        short = _prompt(loaded, "Tell me a story about a fox.")
        with trio.fail_after(DEADLINE):
            model.send(Admit(1, SequenceSpec(long, 400, 0.0, 1.0, top_logprobs=2)))
            first = await read(model.slots[1], until_tokens=3)  # it decodes alone now
            model.send(Admit(2, SequenceSpec(short, 24, 0.0, 1.0)))  # it goes back: batched
            beside = await read(model.slots[2])  # ends long before the first: alone again
            rest = await read(model.slots[1])
            await ended_all(model, {1, 2})
        entries, _ = _totals(model)
    whole = Transcript(
        first.text + rest.text,
        first.tokens + rest.tokens,
        rest.finish,
        rest.cached_tokens,
        first.logprobs + rest.logprobs,
    )
    assert beside.finish in ("stop", "length")
    assert entries == 2  # alone before the second came, and again after it ended
    assert len(whole.logprobs) == whole.tokens
    # The same request decoded batched from its first token to its last (a second sequence
    # beside it throughout): the same text, token count and log-probabilities.
    async with engine(lockstep=False) as model:
        with trio.fail_after(DEADLINE):
            model.send(Admit(1, SequenceSpec(long, 400, 0.0, 1.0, top_logprobs=2)))
            model.send(Admit(2, SequenceSpec(long, 400, 0.0, 1.0)))
            batched = await read(model.slots[1])
            await read(model.slots[2])
            await ended_all(model, {1, 2})
        entries, _ = _totals(model)
    assert entries == 0  # never alone: they ended together
    assert whole.text == batched.text
    assert whole.tokens == batched.tokens
    assert whole.finish == batched.finish
    # Each token's log-probability and its two alternatives: the same tokens, the values to
    # float rounding (a batch of two computes in another order than a batch of one).
    assert _logprob_rows(whole) == pytest.approx(_logprob_rows(batched), abs=1e-4)
    assert _logprob_tokens(whole) == _logprob_tokens(batched)
    with trio.fail_after(DEADLINE):
        assert whole.text == await _mlx_lm(model, long, 400)


async def test_a_sequence_alone_cancels_and_stops_at_once_and_its_work_serves_the_next_turn() -> (
    None
):
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        story = _prompt(loaded, "Tell me a story about a fox.")
        with trio.fail_after(DEADLINE):
            model.send(Admit(1, SequenceSpec(story, 400, 0.0, 1.0)))
            partial = await read(model.slots[1], until_tokens=3)
            model.send(Cancel(1))
            rest = await read(model.slots[1])
            await ended_all(model, {1})
            assert rest.finish == "cancelled"
            assert partial.tokens + rest.tokens < 400
            assert model.facts.latest().active == 0  # nothing of it is left in the batch
            # A consumer that found its end: the sequence stops, its work kept for the next turn.
            model.send(Admit(2, SequenceSpec(story, 400, 0.0, 1.0)))
            partial = await read(model.slots[2], until_tokens=4)
            model.send(StopMatched(2))
            rest = await read(model.slots[2])
            await ended_all(model, {2})
            assert rest.finish == "stop"
            reply = loaded.tokenizer.encode(partial.text + rest.text)
            turn = (*story, *reply, *_prompt(loaded, "Go on."))
            follow = await _answer(model, 3, SequenceSpec(turn, 8, 0.0, 1.0))
        entries, _ = _totals(model)
    assert entries >= 2  # the cancelled and the stopped sequences each decoded alone
    assert follow.cached_tokens > len(story)  # the prompt and some of the reply were kept


async def test_a_stop_text_ends_a_sequence_alone_where_it_ends_it_batched() -> None:
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        story = _prompt(loaded, "Count from 1 to 400.")
        with trio.fail_after(DEADLINE):
            free = await _answer(model, 1, SequenceSpec(story, 120, 0.0, 1.0))
        words = free.text.split()
        assert len(words) > 12, free.text
        stop = words[len(words) // 2]  # a word from the middle of what it says unstopped
        expected = free.text[: free.text.index(stop)]
        with trio.fail_after(DEADLINE):
            model.send(ClearPromptCache())  # what the next turn finds, the stop kept
            alone = await _answer(model, 2, SequenceSpec(story, 120, 0.0, 1.0, stop_texts=(stop,)))
            entries, _ = _totals(model)
            reply = loaded.tokenizer.encode(alone.text)
            turn = (*story, *reply, *_prompt(loaded, "Go on."))
            follow = await _answer(model, 5, SequenceSpec(turn, 8, 0.0, 1.0))
            # Beside a second sequence throughout: batched from its first token to its last.
            model.send(Admit(3, SequenceSpec(story, 120, 0.0, 1.0, stop_texts=(stop,))))
            model.send(Admit(4, SequenceSpec(story, 120, 0.0, 1.0)))
            batched = await read(model.slots[3])
            await read(model.slots[4])
            await ended_all(model, {3, 4})
    assert entries == 2  # the unstopped sequence and the stopped one each decoded alone
    assert alone.finish == "stop"
    assert follow.cached_tokens > len(story)  # the prompt and the reply up to the stop
    assert alone.text == expected
    assert batched.text == expected
    assert batched.finish == "stop"


async def test_solo_decode_off_keeps_a_lone_sequence_in_the_generator_with_the_same_tokens() -> (
    None
):
    settings = settings_from_args(build_parser({}).parse_args(["serve", "--solo-decode", "off"]))
    assert settings.model.solo_decode is False
    assert settings_from_args(build_parser({}).parse_args(["serve"])).model.solo_decode is True
    token = trio.lowlevel.current_trio_token()
    facts = FactStream(token)
    thread = GenerationThread(
        ThreadSettings(str(BUNDLED_MODEL_PATH), prompt_cache_bytes=0, solo_decode=False), facts
    )
    thread.start()
    try:
        with trio.fail_after(DEADLINE):
            loaded = await facts.receive()
            assert isinstance(loaded, Loaded)
            assert loaded.loaded is not None
            prompt = _prompt(loaded.loaded, "Count from 1 to 400.")
            slot = SequenceSlot(token)
            thread.send(Admit(1, SequenceSpec(prompt, 120, 0.0, 1.0), slot))
            batched = await read(slot)
        batch = thread._batch
        assert batch is not None
        # It prefilled and decoded in the generator throughout.
        assert batch.totals.solo_entries + batch.totals.solo_prefills == 0
        assert batched.tokens == 120
    finally:
        thread.send(Shutdown())
        await trio.to_thread.run_sync(thread.join, DEADLINE)
    async with engine(lockstep=False) as model:  # on by default: alone, the same tokens
        with trio.fail_after(DEADLINE):
            alone = await _answer(model, 1, SequenceSpec(prompt, 120, 0.0, 1.0))
        assert _totals(model)[0] == 1
    assert alone == replace(batched, cached_tokens=alone.cached_tokens)


@pytest.mark.parametrize("value", ["yes", "1", ""])
def test_a_bad_solo_decode_value_is_refused_naming_the_flag(value: str) -> None:
    assert_flag_refused("--solo-decode", "MLX_RESPONSES_SOLO_DECODE", value, "'on' or 'off'")


async def test_a_sequence_whose_cache_is_large_for_its_answer_stays_in_the_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Going alone copies the cache: a sequence goes only once it generated a token per
    # SOLO_BYTES_PER_TOKEN of it. At one byte a token, the bundled model's cache is worth more
    # tokens than the answer has: it stays batched, and answers the same.
    monkeypatch.setattr(batch_module, "SOLO_BYTES_PER_TOKEN", 1)
    # The rule is the generator's: no prefill alone, so the sequence starts there.
    monkeypatch.setattr(batch_module.Batch, "_alone", lambda _batch: None)
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        prompt = _prompt(loaded, "Count from 1 to 400.")
        with trio.fail_after(DEADLINE):
            stayed = await _answer(model, 1, SequenceSpec(prompt, 120, 0.0, 1.0))
        assert _totals(model)[0] == 0
    monkeypatch.undo()
    async with engine(lockstep=False) as model:
        with trio.fail_after(DEADLINE):
            alone = await _answer(model, 1, SequenceSpec(prompt, 120, 0.0, 1.0))
        assert _totals(model)[0] == 1
    assert stayed == replace(alone, cached_tokens=stayed.cached_tokens)


async def test_penalties_and_top_k_go_alone_with_the_sequence_and_a_grammar_stays_batched() -> None:
    # Presence and frequency penalties change a greedy answer (they read every token the
    # sequence has seen), top_k keeps the likeliest: their context must be the generator's at
    # both switches, or the answer alone differs from the answer batched.
    adjust = SamplingAdjust(presence_penalty=1.5, frequency_penalty=1.0, top_k=3)
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        long = _prompt(loaded, "Count from 1 to 400.")
        with trio.fail_after(DEADLINE):
            plain = await _answer(model, 9, SequenceSpec(long, 160, 0.0, 1.0))
            model.send(Admit(1, SequenceSpec(long, 160, 0.0, 1.0, adjust=adjust)))
            first = await read(model.slots[1], until_tokens=3)  # it decodes alone now
            model.send(Admit(2, SequenceSpec(long, 40, 0.0, 1.0)))  # back in: batched
            beside = await read(model.slots[2])  # ends long before the first: alone again
            rest = await read(model.slots[1])
            await ended_all(model, {1, 2})
            entries, _ = _totals(model)
            assert loaded.constraints is not None
            json = loaded.constraints.json_object()
            grammar = GrammarSpec(json.kind, json.source)
            shaped = await _answer(model, 3, SequenceSpec(long, 24, 0.0, 1.0, grammar=grammar))
            after_grammar, _ = _totals(model)
    assert entries == 3  # the plain one, then the penalized one twice
    assert beside.tokens == 40  # 40 steps batched between the two
    assert after_grammar == entries  # a grammar's matcher keeps state: it stays batched
    assert shaped.tokens > 0
    penalized = first.text + rest.text
    assert penalized != plain.text  # the penalties changed what it says
    # The same request batched from its first token to its last, beside another throughout.
    async with engine(lockstep=False) as model:
        with trio.fail_after(DEADLINE):
            model.send(Admit(1, SequenceSpec(long, 160, 0.0, 1.0, adjust=adjust)))
            model.send(Admit(2, SequenceSpec(long, 400, 0.0, 1.0)))
            batched = await read(model.slots[1])
            companion = await read(model.slots[2])
            await ended_all(model, {1, 2})
    assert companion.tokens > batched.tokens  # it outlived the first: that was never alone
    assert penalized == batched.text
    assert first.tokens + rest.tokens == batched.tokens


async def _cancelled_then_next_turn(model: Engine) -> tuple[Transcript, int]:
    """A story cancelled three tokens in, then the next turn of its conversation: what that
    turn found in the prompt cache, and the prompt's length."""
    loaded = _loaded(model)
    story = _prompt(loaded, "Tell me a story about a fox.")
    with trio.fail_after(DEADLINE):
        model.send(Admit(1, SequenceSpec(story, 400, 0.0, 1.0)))
        await read(model.slots[1], until_tokens=3)
        model.send(Cancel(1))
        assert (await read(model.slots[1])).finish == "cancelled"
        await ended_all(model, {1})
        turn = (*story, *_prompt(loaded, "Go on."))
        return await _answer(model, 2, SequenceSpec(turn, 8, 0.0, 1.0)), len(story)


async def test_a_lone_prompt_is_prefilled_alone_and_its_end_serves_the_next_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A lone short prompt never enters the generator: one call of the model on the prompt
    # samples its first token. A cancel keeps nothing of the answer, only the checkpoint of
    # the prompt's end, which the next turn finds as it finds the generator's.
    async with engine(lockstep=False) as model:
        alone, prompt_tokens = await _cancelled_then_next_turn(model)
        prefills, (went_alone, _) = _prefills(model), _totals(model)
    assert prefills == 2  # the story and the next turn, each alone
    assert went_alone == prefills  # neither went through the generator first
    assert prompt_tokens - 1 <= alone.cached_tokens <= prompt_tokens
    monkeypatch.setattr(batch_module.Batch, "_alone", lambda _batch: None)
    async with engine(lockstep=False) as model:
        batched, _ = await _cancelled_then_next_turn(model)
        assert _prefills(model) == 0
    assert alone == batched


async def test_a_first_token_that_is_the_last_leaves_one_entry_for_the_next_turn() -> None:
    # The answer ends with its first token, in the step that prefilled it alone: its whole
    # cache (the prompt and that token) is stored, and no second entry for the prompt alone,
    # which the whole one serves.
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        prompt = _prompt(loaded, "Count from 1 to 400.")
        with trio.fail_after(DEADLINE):
            one = await _answer(model, 1, SequenceSpec(prompt, 1, 0.0, 1.0))
            again = await _answer(model, 2, SequenceSpec(prompt, 1, 0.0, 1.0))
            entries = model.facts.latest().prompt_cache.entries
        assert _prefills(model) == 2
    with trio.fail_after(DEADLINE):
        assert one.text == await _mlx_lm(model, prompt, 1)
    assert one.finish == again.finish == "length"
    assert one.tokens == 1
    assert again == replace(one, cached_tokens=again.cached_tokens)
    assert again.cached_tokens == len(prompt) - 1  # all of it but the token fed again
    assert entries == 1


async def test_a_prompt_prefilled_alone_on_a_served_prefix_leaves_the_entry_it_came_from() -> None:
    # "Say goodbye" is served the prefix it shares with "Say hello"'s entry, and prefilled
    # alone from there. The served layers share that entry's arrays: written in place, the
    # entry would hold goodbye's keys, and "Say hello" asked again would answer from them.
    async with engine(lockstep=False) as model:
        loaded = _loaded(model)
        hello = _prompt(loaded, "Please say the word hello.")
        goodbye = _prompt(loaded, "Please say the word goodbye.")
        shared = next(i for i, (a, b) in enumerate(zip(hello, goodbye, strict=False)) if a != b)
        with trio.fail_after(DEADLINE):
            first = await _answer(model, 1, SequenceSpec(hello, 12, 0.0, 1.0))
            other = await _answer(model, 2, SequenceSpec(goodbye, 12, 0.0, 1.0))
            again = await _answer(model, 3, SequenceSpec(hello, 12, 0.0, 1.0))
        assert _prefills(model) == 3
    assert other.cached_tokens == shared  # served from hello's entry, then prefilled alone
    assert again.cached_tokens == len(hello) - 1
    assert again == replace(first, cached_tokens=again.cached_tokens)
    with trio.fail_after(DEADLINE):
        assert other.text == await _mlx_lm(model, goodbye, 12)
