"""``formats`` is pure: importing it, and every module in it, loads neither MLX nor Trio
(a format must be usable, and testable, where neither is)."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import importlib, json, pkgutil, sys
import mlx_responses.formats as pkg
for info in pkgutil.iter_modules(pkg.__path__):
    importlib.import_module(f"mlx_responses.formats.{info.name}")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("mlx", "mlx_lm", "trio"))))
"""


def test_formats_imports_neither_mlx_nor_trio() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
