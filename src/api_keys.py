"""API keys and tenants: the configured keys, a value of the settings; the HTTP
edge (``http/auth.py``) checks each request against them.

Invariants:
- With no key configured the server is open and every request is the one tenant ``""``.
- Each key is a tenant: its name from the keys file, else a digest of the key. The key itself
  is never stored in the clear, never logged.
- Keys are compared in constant time: the presented key's SHA-256 against every configured
  digest with ``hmac.compare_digest``, all of them, whatever matches.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """Configured keys as (digest, tenant) pairs."""

    entries: tuple[tuple[bytes, str], ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def tenant_of(self, presented: str | None) -> str | None:
        """The tenant of a presented key, or None when it matches no configured key."""
        if presented is None:
            return None
        digest = _digest(presented)
        found: str | None = None
        for known, tenant in self.entries:
            if hmac.compare_digest(digest, known) and found is None:
                found = tenant
        return found


def tenant_name(key: str, name: str | None = None) -> str:
    return name or "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def load_api_keys(keys: Iterable[str], keys_file: str | None = None) -> ApiKeys:
    """``--api-key`` values and ``--api-keys-file`` lines (``KEY [NAME]``, ``#`` comments)."""
    pairs: list[tuple[str, str | None]] = [(k, None) for k in keys if k]
    if keys_file:
        for line in Path(keys_file).read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, name = line.partition(" ")
            pairs.append((key, name.strip() or None))
    return ApiKeys(tuple((_digest(key), tenant_name(key, name)) for key, name in pairs))


OPEN = ApiKeys()
