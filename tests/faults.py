"""Fault injection through the model's seam (``ModelSettings.thread_factory``), test-only."""

from __future__ import annotations

import threading
from typing import Any

from mlx_responses.model.thread import GenerationThread


class ThreadFaults:
    """Installs generation threads that misbehave on request: ``crash()`` makes the thread die
    at its next step (as on an MLX error); ``poison()`` makes the next token's output
    malformed, so the response task that consumes it raises (a bug inside one response)."""

    def __init__(self) -> None:
        self._crash = threading.Event()
        self._poison = threading.Event()

    def crash(self) -> None:
        self._crash.set()

    def poison(self) -> None:
        self._poison.set()

    def factory(self, *args: Any, **kwargs: Any) -> GenerationThread:
        faults = self

        class FaultyThread(GenerationThread):
            def _step(self, generator: Any) -> None:
                if faults._crash.is_set():
                    faults._crash.clear()
                    raise RuntimeError("generation thread crash injected by a test")
                super()._step(generator)

            def _deliver(self, generator: Any, entry: Any, response: Any) -> None:
                if faults._poison.is_set():
                    faults._poison.clear()
                    entry.slot.push(text=12345, new_tokens=1)  # not text: its consumer fails
                super()._deliver(generator, entry, response)

        return FaultyThread(*args, **kwargs)
