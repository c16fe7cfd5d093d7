"""Opaque, unguessable identifiers for API objects.

Invariants:
- An id is ``<prefix><sep><48 lowercase hex digits>``, 192 bits from :mod:`secrets`, so ids never
  collide in practice and cannot be enumerated across tenants.
- ``sep`` is ``_`` for every prefix except ``file``, which OpenAI spells ``file-``.
- Pure apart from the OS random source: no clock, no counter, no global state.
"""

from __future__ import annotations

import re
import secrets

__all__ = ["ID_HEX_LEN", "KNOWN_PREFIXES", "new_id"]

ID_HEX_LEN = 48
"""Number of hex digits after the separator."""

KNOWN_PREFIXES = frozenset({"resp", "msg", "fc", "rs", "cmp", "cmpt", "conv", "file"})
"""The prefixes the server mints (docs/api.md); others are accepted but are a likely typo at a call site."""

_PREFIX_RE = re.compile(r"[a-z][a-z0-9]*")


def new_id(prefix: str) -> str:
    """Return a fresh id such as ``resp_3f…`` (or ``file-3f…`` for ``prefix="file"``)."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"id prefix must be lowercase alphanumeric, got {prefix!r}")
    sep = "-" if prefix == "file" else "_"
    return f"{prefix}{sep}{secrets.token_hex(ID_HEX_LEN // 2)}"
