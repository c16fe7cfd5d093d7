"""The programs beside the package (``bench/``, ``scripts/``) still import: every name they take
from ``mlx_responses`` and from each other exists. ``make check`` type-checks ``src/`` only, so a
name moved or removed there would otherwise break a benchmark unnoticed until someone ran it
(a session removed ``protocol.history.items_from_json``, which two of them use).

Each folder is imported in a subprocess of its own: the programs import their siblings by bare
name (``from throughput import ...``), which must not shadow anything in the test process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_SECONDS = 180

_IMPORT_ALL = """
import importlib, sys, pathlib
folder = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(folder))
for path in sorted(folder.glob("*.py")):
    importlib.import_module(path.stem)
    print(path.name)
"""


@pytest.mark.parametrize("folder", ["bench", "scripts"])
def test_every_program_imports(folder: str) -> None:
    programs = sorted(path.name for path in (ROOT / folder).glob("*.py"))
    assert programs, f"no programs in {folder}/"
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(ROOT / folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == programs
