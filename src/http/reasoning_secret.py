"""Where the sealed-reasoning secret comes from (docs/api.md, "Sealed reasoning").

Invariants:
- ``MLX_RESPONSES_REASONING_SECRET`` (a string) wins; else the file the settings name
  (``ServerSettings.reasoning_secret_path``: ``--reasoning-secret-file``, else
  ``reasoning-secret`` under ``--data-dir``).
- A missing file is created once with 32 random bytes (hex), mode 0600, exclusively (two servers
  starting together agree on one secret). Nothing is read or written until a request needs it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..protocol.items.sealed import Sealer, secret_from_text

SECRET_ENV = "MLX_RESPONSES_REASONING_SECRET"


def _read_or_create(path: Path) -> bytes:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
    text = path.read_text().strip()
    if not text:
        raise RuntimeError(f"the reasoning secret file {path} is empty")
    return secret_from_text(text)


def load_key(path: Path) -> bytes:
    configured = os.environ.get(SECRET_ENV)
    if configured:
        return secret_from_text(configured)
    return _read_or_create(path)


def reasoning_sealer(model_alias: str, path: Path) -> Sealer:
    """The server's sealer for ``model_alias``, its secret in ``path`` (read on first use)."""
    return Sealer(lambda: load_key(path), model_alias)
