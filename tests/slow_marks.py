"""Which tests are ``slow`` (docs/testing.md): those that start a real part - the HTTP server,
the model, PostgreSQL, Chromium, a subprocess. ``conftest.pytest_collection_modifyitems`` marks
them at collection, so nobody has to remember to, and ``make test-fast`` leaves them out.

A test starts one when it uses one of ``SLOW_FIXTURES`` (directly or through other fixtures), or
when its module imports, anywhere in its text (a local import inside a fixture counts), what
starts one: a module of ``SLOW_MODULES``, a name of ``SLOW_NAMES``, or a test helper module
that does (``tests/postgres.py``, ``tests/browser.py``, ``tests/fuzz/``, a slow test module's
helpers). Read from the source, not by running anything."""

from __future__ import annotations

import ast
from pathlib import Path

SLOW_FIXTURES = frozenset({"server", "client", "postgresql_server", "postgresql_url"})
SLOW_MODULES = ("subprocess", "mlx_lm", "mlx_vlm")
SLOW_NAMES = frozenset(
    {("mlx_responses.server", "serve"), ("mlx_responses.engine.thread", "GenerationThread")}
)

TESTS = Path(__file__).resolve().parent
# The fixtures' own module: what it imports to build them is covered by SLOW_FIXTURES.
NOT_FOLLOWED = frozenset({TESTS / "conftest.py"})
_known: dict[Path, bool] = {}


def is_slow(path: Path, fixtures: frozenset[str] | set[str] | list[str]) -> bool:
    return bool(SLOW_FIXTURES.intersection(fixtures)) or starts_real_parts(path.resolve())


def starts_real_parts(path: Path) -> bool:
    if path not in _known:
        _known[path] = False  # while it is read: an import cycle adds nothing
        _known[path] = _imports_real_parts(path)
    return _known[path]


def _imports_real_parts(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(alias.name.startswith(SLOW_MODULES) for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            if module.startswith(SLOW_MODULES):
                return True
            if any((module, alias.name) in SLOW_NAMES for alias in node.names):
                return True
            helpers = [_helper(module)] + [_helper(f"{module}.{a.name}") for a in node.names]
            if any(
                h is not None and h not in NOT_FOLLOWED and starts_real_parts(h) for h in helpers
            ):
                return True
    return False


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an import names, relative ones resolved against ``path``'s package."""
    if not node.level:
        return node.module or ""
    package = path.parent.relative_to(TESTS.parent).parts
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _helper(module: str) -> Path | None:
    """The file of a module under ``tests/``, if ``module`` is one."""
    if not module.startswith("tests."):
        return None
    base = TESTS.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None
