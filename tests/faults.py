"""Fault injection through the model's seam (``ModelSettings.thread_factory``), test-only."""

from __future__ import annotations

import threading
from typing import Any

from mlx_responses.model.thread import GenerationThread


class ThreadFaults:
    """Installs generation threads that die at their next step once ``crash()`` was called."""

    def __init__(self) -> None:
        self._crash = threading.Event()

    def crash(self) -> None:
        """The current generation thread dies at its next step, as on an MLX error."""
        self._crash.set()

    def factory(self, *args: Any, **kwargs: Any) -> GenerationThread:
        faults = self

        class CrashingThread(GenerationThread):
            def _step(self, generator: Any) -> None:
                if faults._crash.is_set():
                    faults._crash.clear()
                    raise RuntimeError("generation thread crash injected by a test")
                super()._step(generator)

        return CrashingThread(*args, **kwargs)
