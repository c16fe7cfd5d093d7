"""Start ``mlx-responses`` with every ``BatchGenerator.next`` call timed (for ``step_period.py``).

Run::

    python bench/step_recorder.py OUT.json serve --model PATH ...

``OUT.json`` gets, when the server exits (SIGTERM: it shuts down cleanly), one record per call
of mlx-lm's ``BatchGenerator.next`` on the generation thread: ``[began, ended, generated,
prompts]`` (``time.perf_counter`` seconds; how many generation and prompt responses the call
returned). A sequence alone decodes outside the generator (``Batch._solo_step``: the model
called on its own cache, its token delivered); those steps are recorded too, one generated
token each. The wrapper adds one clock read and one list append per step; nothing else in the
server changes. The same recording wraps the direct side (``record_steps``).
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from typing import Any

StepRecord = tuple[float, float, int, int]


def record_steps(into: list[StepRecord]) -> None:
    """Wrap mlx-lm's ``BatchGenerator.next`` in this process so each call appends its record."""
    from mlx_lm.generate import BatchGenerator

    original = BatchGenerator.next
    clock = time.perf_counter

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = clock()
        result = original(self, *args, **kwargs)
        prompts, generated = result if isinstance(result, tuple) else ((), result)
        into.append((began, clock(), len(generated), len(prompts)))
        return result

    BatchGenerator.next = timed  # type: ignore[method-assign]


def record_solo_steps(into: list[StepRecord]) -> None:
    """Wrap the server's step of a sequence alone (``Batch._solo_step``) likewise."""
    from mlx_responses.engine.batch import Batch

    original = Batch._solo_step
    clock = time.perf_counter

    def timed(self: Any) -> None:
        began = clock()
        original(self)
        into.append((began, clock(), 1, 0))

    Batch._solo_step = timed  # type: ignore[method-assign]


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    from mlx_responses.blas import preload_openblas

    preload_openblas()  # before mlx, as the entry point does
    records: list[StepRecord] = []
    record_steps(records)
    record_solo_steps(records)

    def write() -> None:
        with open(out, "w", encoding="utf-8") as file:
            json.dump(records, file)

    atexit.register(write)
    from mlx_responses.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
