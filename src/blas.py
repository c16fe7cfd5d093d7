"""OpenBLAS for MLX's CPU backend on Linux (platform notes).

Invariants:
- ``preload_openblas`` runs before anything imports ``mlx``: importing the package runs it
  (``mlx_responses/__init__.py``: the test suite, the benchmarks), and so does the
  ``mlx-responses`` entry point (``launch.main``): ``libopenblas.so.0`` is loaded with ``RTLD_GLOBAL`` so the
  CPU wheel's BLAS symbols resolve to it (2-15x faster prefill and decode than the reference
  BLAS). It never fails: without the library the server runs as before.
- ``MLX_RESPONSES_OPENBLAS=0`` skips it (for measuring the difference).
- Before loading it, ``OPENBLAS_THREAD_TIMEOUT`` defaults to ``THREAD_TIMEOUT`` (a value the
  environment already has is kept): an idle OpenBLAS worker spins 2^22 cycles (~1.5 ms)
  before it sleeps, not OpenBLAS's 2^28 (~0.1 s). The generation thread runs the steps that
  prefill on more threads than the decode steps of a small model (``engine/blas_threads.py``);
  after each prefill the spare worker spun through the first decode steps, taking a core from
  the event loop, which then sent the first token ~10 ms late (docs/benchmarks.md). Within a
  step the products come far closer together than 1.5 ms, so the workers stay awake there.
- ``openblas_loaded`` reads the process's own mappings, so a library preloaded any other way
  (``LD_PRELOAD``) counts too.
"""

from __future__ import annotations

import ctypes
import os
import sys

OPENBLAS = "libopenblas.so.0"
DISABLE_ENV = "MLX_RESPONSES_OPENBLAS"
THREAD_TIMEOUT_ENV = "OPENBLAS_THREAD_TIMEOUT"  # read once, when the library loads
THREAD_TIMEOUT = "22"  # log2 of the CPU cycles an idle worker spins (OpenBLAS's default: 28)
HINT = (
    "MLX's CPU backend is using the slow reference BLAS; install OpenBLAS for 2-15x faster "
    "prefill and decode (Debian/Ubuntu: `apt-get install libopenblas0-pthread`)."
)


def preload_openblas() -> bool:
    """Load OpenBLAS globally if this is Linux and it exists; whether it is loaded now."""
    if not sys.platform.startswith("linux"):
        return False
    if os.environ.get(DISABLE_ENV, "1").lower() in ("0", "false", "no", "off"):
        return openblas_loaded()
    os.environ.setdefault(THREAD_TIMEOUT_ENV, THREAD_TIMEOUT)
    try:
        ctypes.CDLL(OPENBLAS, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def openblas_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libopenblas" in line for line in maps)
    except OSError:
        return False
