"""API keys at the HTTP edge: the key a request presents.

Invariants:
- With keys, every route but ``/health`` needs ``Authorization: Bearer <key>`` (or Anthropic's
  ``x-api-key``); a missing or wrong key is 401. The keys themselves, their tenants and the
  constant-time check are ``api_keys.py`` (a value of the settings), re-exported here.
"""

from __future__ import annotations

from ..api_keys import OPEN, ApiKeys, load_api_keys, tenant_name

__all__ = ["OPEN", "ApiKeys", "load_api_keys", "presented_key", "tenant_name"]


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return x_api_key or None
