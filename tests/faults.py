"""Fault injection through the model's seam (``ModelSettings.thread_factory``), test-only."""

from __future__ import annotations

import threading
from typing import Any

from mlx_responses.engine.batch import Batch
from mlx_responses.engine.inbound import SequenceSpec
from mlx_responses.engine.thread import GenerationThread


class ThreadFaults:
    """Installs generation threads that misbehave on request: ``crash()`` makes the thread die
    at its next step (as on an MLX error); ``poison()`` makes the next token's output
    malformed, so the response task that consumes it raises (a bug inside one response);
    ``break_detokenizer()`` gives the next token's consumer an id its detokenizer cannot read
    (the consumer detokenizes, ``SequenceSlot.detokenize_with``); ``break_processors(owner)``
    breaks the logits processors of that owner's sequences."""

    def __init__(self) -> None:
        self._crash = threading.Event()
        self._poison = threading.Event()
        self._unreadable = threading.Event()
        self._broken: dict[str, int] = {}

    def crash(self) -> None:
        self._crash.set()

    def poison(self) -> None:
        self._poison.set()

    def break_detokenizer(self) -> None:
        self._unreadable.set()

    def break_processors(self, owner: str, after: int = 3) -> None:
        """Sequences of ``owner`` get a logits processor that raises after ``after`` calls
        (a fault in one sequence's own code on the generation thread)."""
        self._broken[owner] = after

    def factory(self, *args: Any, **kwargs: Any) -> GenerationThread:
        faults = self

        class FaultyBatch(Batch):
            def _deliver(self, entry: Any, response: Any) -> None:
                if faults._poison.is_set():
                    faults._poison.clear()
                    entry.slot.push(text=12345, new_tokens=1)  # not text: its consumer fails
                if faults._unreadable.is_set() and entry.detokenizer is None:
                    faults._unreadable.clear()
                    entry.slot.push(new_tokens=1, token="not an id")  # its detokenizer fails
                super()._deliver(entry, response)

            def _processors(self, spec: SequenceSpec) -> list[Any]:
                after = faults._broken.get(spec.owner)
                if after is None:
                    return super()._processors(spec)
                calls = {"n": 0}

                def processor(_tokens: Any, logits: Any) -> Any:
                    calls["n"] += 1
                    if calls["n"] > after:
                        raise ValueError("a broken logits processor")
                    return logits

                return [processor]

        class FaultyThread(GenerationThread):
            batch_class = FaultyBatch

            def _step(self, batch: Batch) -> None:
                if faults._crash.is_set():
                    faults._crash.clear()
                    raise RuntimeError("generation thread crash injected by a test")
                super()._step(batch)

        return FaultyThread(*args, **kwargs)
