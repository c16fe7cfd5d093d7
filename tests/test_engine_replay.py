"""The engine's one port: a generation thread driven only through its inbound
stream records what it applied (its journal: plain messages and the steps between them), and
that journal replayed on a second thread, in lockstep, gives the same outputs token for token:
greedy and seeded sampling, a grammar named by its text, a cancel and a consumer's stop in the
middle of a sequence, prompt-cache hits and a cleared cache included. The real thread on the bundled model.
Image requests too: an image travels in its ``Admit`` (the processor's arrays), so the journal
of a run on the vision fixture replays to the same answers; an image the prompt cache already
holds is recorded without its pixels, and the turn answers as it does with them."""

from __future__ import annotations

import pickle
import queue
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import trio

from mlx_responses.actors.model import (
    GenerationRequest,
    GenerationSequence,
    ModelHandle,
    ModelSettings,
    run_model_actor,
)
from mlx_responses.engine.bundled_model import BUNDLED_MODEL_PATH
from mlx_responses.engine.inbound import (
    Admit,
    Cancel,
    ClearPromptCache,
    GrammarSpec,
    Inbound,
    SequenceSpec,
    Shutdown,
    Step,
    StopMatched,
)
from mlx_responses.engine.loader import LoadedModel, render_prompt
from mlx_responses.engine.outbound import Ended, Exited, FactStream, Loaded
from mlx_responses.engine.penalties import SamplingAdjust
from mlx_responses.engine.slot import SequenceSlot
from mlx_responses.engine.thread import GenerationThread, ThreadSettings
from mlx_responses.protocol.items.images import ImageRef

from .test_vision_api import COLOURS, FIXTURE, QUESTION, data_url, png

DEADLINE = 120
CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class Transcript:
    """Everything a sequence's consumer received."""

    text: str
    tokens: int
    finish: str | None
    cached_tokens: int
    logprobs: tuple[object, ...]


class Engine:
    def __init__(self, *, lockstep: bool, path: str) -> None:
        self.facts = FactStream(trio.lowlevel.current_trio_token())
        self.journal: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self.thread = GenerationThread(
            ThreadSettings(path, prompt_cache_bytes=CACHE_BYTES),
            self.facts,
            lockstep=lockstep,
            journal=self.journal,
        )
        self.slots: dict[int, SequenceSlot] = {}
        self.loaded: LoadedModel | None = None

    def send(self, message: Inbound) -> None:
        if isinstance(message, Admit):
            slot = SequenceSlot(trio.lowlevel.current_trio_token())
            self.slots[message.seq_id] = slot
            message = replace(message, output=slot)
        self.thread.send(message)

    def recorded(self) -> list[Inbound]:
        out: list[Inbound] = []
        while True:
            try:
                out.append(self.journal.get_nowait())
            except queue.Empty:
                return out


@asynccontextmanager
async def engine(*, lockstep: bool, path: str = str(BUNDLED_MODEL_PATH)) -> AsyncIterator[Engine]:
    running = Engine(lockstep=lockstep, path=path)
    running.thread.start()
    try:
        with trio.fail_after(DEADLINE):
            fact = await running.facts.receive()
        assert isinstance(fact, Loaded), fact
        running.loaded = fact.loaded
        yield running
    finally:
        running.thread.send(Shutdown())
        await trio.to_thread.run_sync(running.thread.join, DEADLINE)


async def read(slot: SequenceSlot, until_tokens: int | None = None) -> Transcript:
    """Read ``slot`` to its finish (or until it generated ``until_tokens``)."""
    text, tokens, finish, logprobs = "", 0, None, []
    while until_tokens is None or tokens < until_tokens:
        try:
            out = await slot.receive()
        except trio.EndOfChannel:
            break
        text += out.text
        tokens += out.new_tokens
        finish = out.finish or finish
        logprobs.extend(out.logprobs)
    return Transcript(text, tokens, finish, slot.cached_tokens, tuple(logprobs))


async def drive(model: Engine) -> tuple[dict[int, Transcript], int]:
    """A day's work for the free-running thread, through its inbound stream only."""
    loaded = model.loaded
    assert loaded is not None
    assert loaded.constraints is not None
    tokenizer = loaded.tokenizer

    def prompt(text: str) -> tuple[int, ...]:
        chat = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        return tuple(int(t) for t in rendered)

    count = prompt("Count from 1 to 40.")
    story = prompt("Tell me a story about a fox.")
    json = loaded.constraints.json_object()
    specs = {
        1: SequenceSpec(count, 24, 0.0, 1.0, top_logprobs=2),
        2: SequenceSpec(story, 24, 0.9, 0.95, seed=7),
        3: SequenceSpec(story, 24, 0.9, 1.0, seed=11, adjust=SamplingAdjust(0.5, 0.3, 20)),
        4: SequenceSpec(
            prompt("Give me a JSON object."),
            24,
            0.0,
            1.0,
            grammar=GrammarSpec(json.kind, json.source),
        ),
        5: SequenceSpec(story, 400, 0.0, 1.0, stop_texts=("zebra",)),
    }
    transcripts: dict[int, Transcript] = {}
    for seq_id, spec in specs.items():  # a burst: they share the batch
        model.send(Admit(seq_id, spec))
    # Cancel sequence 5 a few tokens in, while the others are still running.
    partial = await read(model.slots[5], until_tokens=3)
    model.send(Cancel(5))
    rest = await read(model.slots[5])
    transcripts[5] = replace(
        rest, text=partial.text + rest.text, tokens=partial.tokens + rest.tokens
    )
    for seq_id in (1, 2, 3, 4):
        transcripts[seq_id] = await read(model.slots[seq_id])
    # The next turn of sequence 1's conversation: served from the prompt cache.
    follow = (*count, *tokenizer.encode(transcripts[1].text), *prompt("And on to 50."))
    model.send(Admit(6, SequenceSpec(follow, 16, 0.0, 1.0)))
    transcripts[6] = await read(model.slots[6])
    model.send(ClearPromptCache())
    model.send(Admit(7, SequenceSpec(follow, 16, 0.0, 1.0)))
    transcripts[7] = await read(model.slots[7])
    # A consumer that found its end: the sequence stops, and its work serves the next turn.
    model.send(Admit(8, SequenceSpec(story, 400, 0.0, 1.0)))
    partial = await read(model.slots[8], until_tokens=4)
    model.send(StopMatched(8))
    rest = await read(model.slots[8])
    transcripts[8] = replace(
        rest, text=partial.text + rest.text, tokens=partial.tokens + rest.tokens
    )
    turn = (*story, *tokenizer.encode(transcripts[8].text), *prompt("Go on."))
    model.send(Admit(9, SequenceSpec(turn, 8, 0.0, 1.0)))
    transcripts[9] = await read(model.slots[9])
    return transcripts, len(story)


async def ended_all(model: Engine, seq_ids: set[int]) -> None:
    """Wait for the thread to report every one of ``seq_ids`` ended."""
    while seq_ids:
        fact = await model.facts.receive()
        assert not isinstance(fact, Exited), fact
        if isinstance(fact, Ended):
            seq_ids -= set(fact.seq_ids)


async def test_a_recorded_stream_replays_to_identical_outputs() -> None:
    async with engine(lockstep=False) as free:
        with trio.fail_after(DEADLINE):
            first, story_tokens = await drive(free)
            await ended_all(free, set(first))
        journal = free.recorded()
    # What the thread was told is plain data: it survives a trip through bytes.
    assert pickle.loads(pickle.dumps(journal)) == journal
    assert all(m.output is None for m in journal if isinstance(m, Admit))
    assert any(isinstance(m, Step) for m in journal)
    # The run did what it claims: a cancel, cache hits, a cleared cache.
    assert first[5].finish == "cancelled"
    assert 3 <= first[5].tokens < 400
    assert first[6].cached_tokens > 0
    assert first[7].cached_tokens == 0
    assert first[8].finish == "stop"
    assert 4 <= first[8].tokens < 400
    assert first[9].cached_tokens > story_tokens  # the prompt and some of the reply
    assert first[1].logprobs
    assert first[4].text.lstrip().startswith("{")

    async with engine(lockstep=True) as replay:
        with trio.fail_after(DEADLINE):
            for message in journal:
                replay.send(message)
            again = {seq_id: await read(slot) for seq_id, slot in replay.slots.items()}
        assert replay.recorded() == journal  # it applied the same messages, step for step
    assert again == first


async def drive_images(model: Engine) -> dict[int, Transcript]:
    """Image requests beside a text one, then an image conversation's next turn (a cache hit),
    then that turn again on an empty prompt cache (its image prefilled again)."""
    loaded = model.loaded
    assert loaded is not None
    assert loaded.vision is not None
    vision, tokenizer = loaded.vision, loaded.tokenizer

    def prompt(chat: list[dict[str, Any]]) -> tuple[int, ...]:
        return tuple(vision.render(chat, lambda c: render_prompt(tokenizer, c)))

    def asked(rgb: tuple[int, int, int]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": (ImageRef(data_url(png(rgb))), QUESTION)}]

    def spec(tokens: tuple[int, ...], max_tokens: int = 12) -> SequenceSpec:
        return SequenceSpec(tokens, max_tokens, 0.0, 1.0, images=vision.images_for(tokens))

    chats = {seq_id: asked(COLOURS[colour]) for seq_id, colour in enumerate(COLOURS, start=1)}
    for seq_id, chat in chats.items():  # a burst: the images share the batch with text
        model.send(Admit(seq_id, spec(prompt(chat))))
    model.send(Admit(4, spec(prompt([{"role": "user", "content": "Count from 1 to 20."}]), 40)))
    transcripts = {seq_id: await read(model.slots[seq_id]) for seq_id in (1, 2, 3, 4)}
    turn = [
        *chats[1],
        {"role": "assistant", "content": transcripts[1].text},
        {"role": "user", "content": QUESTION},
    ]
    model.send(Admit(5, spec(prompt(turn))))
    transcripts[5] = await read(model.slots[5])
    model.send(ClearPromptCache())
    model.send(Admit(6, spec(prompt(turn))))
    transcripts[6] = await read(model.slots[6])
    return transcripts


async def test_a_recorded_stream_with_images_replays_to_identical_outputs() -> None:
    async with engine(lockstep=False, path=str(FIXTURE)) as free:
        with trio.fail_after(DEADLINE):
            first = await drive_images(free)
            await ended_all(free, set(first))
        journal = free.recorded()
    assert pickle.loads(pickle.dumps(journal)) == journal
    admitted = {m.seq_id: m for m in journal if isinstance(m, Admit)}
    assert all(m.spec.images for m in admitted.values() if min(m.spec.prompt) < 0)
    assert sum(1 for m in admitted.values() if m.spec.images) == 5
    # The trained answers: a wrong image or a wrong position shows as a wrong word.
    assert [first[seq_id].text for seq_id in (1, 2, 3)] == list(COLOURS)
    assert first[5].text == "red"
    assert first[5].cached_tokens > 0
    # The next turn's image lies in the prefix the prompt cache served: its Admit was recorded
    # without the image's pixels (only its grid, a few bytes), and the answer is the one the
    # same turn gives with its image prefilled again from an empty cache.
    (image,) = admitted[5].spec.images
    assert not image.has_pixels
    assert [name for name, _ in image.arrays] == ["image_grid_thw"]
    assert sum(len(a.data) for _, a in image.arrays) < 100
    assert all(i.has_pixels for m in admitted.values() if m.seq_id != 5 for i in m.spec.images)
    assert first[6].cached_tokens == 0
    assert replace(first[6], cached_tokens=first[5].cached_tokens) == first[5]

    # A second thread that never saw these images: all it has is the journal.
    async with engine(lockstep=True, path=str(FIXTURE)) as replay:
        with trio.fail_after(DEADLINE):
            for message in pickle.loads(pickle.dumps(journal)):
                replay.send(message)
            again = {seq_id: await read(slot) for seq_id, slot in replay.slots.items()}
        assert replay.recorded() == journal
    assert again == first


async def test_a_sequence_its_consumer_stops_ends_stop_and_serves_the_next_turn() -> None:
    """Through the model actor: ``GenerationSequence.stop`` ends the sequence with ``stop`` (not
    ``cancelled``), and the next turn's prompt is served from what it computed."""
    settings = ModelSettings(model_path=str(BUNDLED_MODEL_PATH), alias="bundled")
    async with trio.open_nursery() as nursery:
        with trio.fail_after(DEADLINE):
            model: ModelHandle = await nursery.start(run_model_actor, settings)
            chat = [{"role": "user", "content": "Tell me a story about a fox."}]
            prompt = tuple(await model.prompts.render(chat))
            sequence = await model.submit(GenerationRequest(prompt, 400, 0.0, 1.0))
            partial = await read_sequence(sequence, until_tokens=4)
            await sequence.stop()
            rest = await read_sequence(sequence)
            assert rest.finish == "stop"
            assert 4 <= partial.tokens + rest.tokens < 400
            reply = partial.text + rest.text
            turn = [
                *chat,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Go on."},
            ]
            following = tuple(await model.prompts.render(turn))
            assert following[: len(prompt)] == prompt
            nxt = await model.submit(GenerationRequest(following, 4, 0.0, 1.0))
            await read_sequence(nxt)
            assert nxt.cached_tokens > len(prompt)  # its reply too, not only its prompt
            await model.shutdown()


async def read_sequence(
    sequence: GenerationSequence, until_tokens: int | None = None
) -> Transcript:
    text, tokens, finish = "", 0, None
    while until_tokens is None or tokens < until_tokens:
        try:
            out = await sequence.receive()
        except trio.EndOfChannel:
            break
        text, tokens, finish = text + out.text, tokens + out.new_tokens, out.finish or finish
    return Transcript(text, tokens, finish, sequence.cached_tokens, ())
