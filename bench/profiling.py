"""``bench/throughput.py --profile DIR``: one more run per side and concurrency under py-spy.

After the measured repeats (so that no figure is taken while py-spy samples), for each
concurrency one server run and one direct run are recorded with::

    py-spy record --pid PID --nonblocking --threads -r 250 -f raw -o FILE

started just before the run and stopped with SIGINT right after it (py-spy writes its file on
SIGINT). ``--nonblocking`` reads the process's memory without pausing it, so the run keeps its
speed; py-spy samples a thread only while it is not idle (no ``--idle``), so the counts follow
CPU use. Beside each raw file goes a ``.summary.txt`` from ``profile_threads.py``: per thread
(the server's "mlx-generation" and "MainThread"; the direct side runs on its "MainThread"),
samples, top functions by self samples and inclusive samples of the frames that matter.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from profile_threads import format_summary, summarize

FALLBACK_PY_SPY = "/tmp/pyspy/bin/py-spy"
SAMPLE_RATE = 250
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 60.0


def find_py_spy(given: str | None) -> str:
    """``given``, else py-spy on PATH, else the fallback install; SystemExit with a hint if none."""
    candidates = [given] if given else [shutil.which("py-spy"), FALLBACK_PY_SPY]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise SystemExit(
        "--profile needs py-spy (pip install py-spy==0.4.3, it is in the test extras), "
        + (f"not found at {given}" if given else f"not on PATH nor at {FALLBACK_PY_SPY}")
        + "; name it with --py-spy PATH"
    )


def _beside(raw: Path, suffix: str) -> Path:
    return raw.with_name(raw.name.removesuffix(".raw.txt") + suffix)


@contextlib.contextmanager
def recording(py_spy: str, pid: int, raw: Path) -> Iterator[None]:
    """py-spy records ``pid`` into ``raw`` while the block runs."""
    log = _beside(raw, ".py-spy.log")
    argv = [py_spy, "record", "--pid", str(pid), "--nonblocking", "--threads"]
    argv += ["-r", str(SAMPLE_RATE), "-f", "raw", "-o", str(raw)]
    with log.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        # It prints "Sampling process ..." once attached; a run started before that is missed.
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"Sampling" not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"py-spy did not start sampling pid {pid}: {log.read_text()}")
            time.sleep(0.05)
        yield
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    if not raw.is_file():
        raise RuntimeError(f"py-spy wrote no {raw} (exit {process.returncode}): {log.read_text()}")


def write_summary(raw: Path, title: str) -> Path:
    summary = _beside(raw, ".summary.txt")
    summary.write_text(format_summary(summarize(raw.read_text(errors="replace")), title))
    return summary


def profile_runs(
    out_dir: Path,
    py_spy: str,
    concurrencies: Sequence[int],
    sides: Sequence[tuple[str, int, Callable[[int], object]]],
    settle_s: float = 0.0,
) -> list[Path]:
    """For each concurrency and each side (name, the pid to record, run(concurrency)): one run
    under py-spy; the raw files and their summaries, in the order written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for concurrency in concurrencies:
        for name, pid, run in sides:
            raw = out_dir / f"{name}-c{concurrency}.raw.txt"
            time.sleep(settle_s)  # as before a measured run: the other side's workers go quiet
            with recording(py_spy, pid, raw):
                run(concurrency)
            summary = write_summary(raw, f"{name}, {concurrency} streams (pid {pid})")
            written += [raw, summary]
            print(f"profile: {raw} and {summary.name}", flush=True)
    return written
