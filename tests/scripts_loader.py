"""Load a module of ``scripts/`` or ``bench/`` (not packages) in a test: their modules import
their siblings by name, so the folder goes on ``sys.path``, and the module is registered in
``sys.modules`` (its dataclasses look their module up there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
BENCH = SCRIPTS.parent / "bench"


def script(name: str) -> ModuleType:
    return load(SCRIPTS, name)


def bench_module(name: str) -> ModuleType:
    return load(BENCH, name)


def load(folder: Path, name: str) -> ModuleType:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module
