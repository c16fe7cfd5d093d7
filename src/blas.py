"""OpenBLAS for MLX's CPU backend on Linux (platform notes).

Invariants:
- ``preload_openblas`` runs before anything imports ``mlx``: importing the package runs it
  (``mlx_responses/__init__.py``: the test suite, the benchmarks), and so does the
  ``mlx-responses`` entry point (``launch.main``): ``libopenblas.so.0`` is loaded with ``RTLD_GLOBAL`` so the
  CPU wheel's BLAS symbols resolve to it (2-15x faster prefill and decode than the reference
  BLAS). It never fails: without the library the server runs as before.
- ``MLX_RESPONSES_OPENBLAS=0`` skips it (for measuring the difference).
- ``openblas_loaded`` reads the process's own mappings, so a library preloaded any other way
  (``LD_PRELOAD``) counts too.
"""

from __future__ import annotations

import ctypes
import os
import sys

OPENBLAS = "libopenblas.so.0"
DISABLE_ENV = "MLX_RESPONSES_OPENBLAS"
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
