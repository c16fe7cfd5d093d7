"""Sealed reasoning: ``include: ["reasoning.encrypted_content"]`` (pure).

Invariants:
- ``Sealer.seal(text)`` is an opaque string: the text encrypted (an HMAC-SHA256 keystream) and
  authenticated (HMAC-SHA256) with the server secret, bound to the served model's alias; a new
  random nonce each time.
- ``Sealer.unseal(blob)`` gives the text back, or raises ``SealError`` for anything it did not
  seal: a changed byte, another server's secret, another model, another format. It never
  returns a guess.
- The key is read lazily (``key_source`` is called on first use, once), so a server whose
  clients never ask for sealed reasoning never touches its secret file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from typing import Final

from ..errors import ApiError
from .read import InputItem, Reasoning

PREFIX: Final = "mlxr1."
_NONCE: Final = 16
_TAG: Final = 32


class SealError(ValueError):
    """A blob this server cannot open (tampered, foreign, or not a blob at all)."""


def sealed_content_error(param: str, why: str) -> ApiError:
    return ApiError(
        400,
        "invalid_request_error",
        f"Invalid value for '{param}': the encrypted reasoning cannot be used: {why}. Sealed "
        "reasoning is only valid on the server and model that produced it.",
        param=param,
        code="invalid_encrypted_content",
    )


def _keystream(key: bytes, nonce: bytes, length: int) -> bytes:
    blocks = []
    for counter in range((length + 31) // 32):
        blocks.append(hmac.digest(key, nonce + counter.to_bytes(4, "big"), "sha256"))
    return b"".join(blocks)[:length]


class Sealer:
    def __init__(self, key_source: Callable[[], bytes], model: str) -> None:
        self._key_source = key_source
        self._keys: tuple[bytes, bytes] | None = None
        self._model = model.encode()

    def _derived(self) -> tuple[bytes, bytes]:
        if self._keys is None:
            root = self._key_source()
            self._keys = (
                hmac.digest(root, b"mlx-responses reasoning encryption", "sha256"),
                hmac.digest(root, b"mlx-responses reasoning authentication", "sha256"),
            )
        return self._keys

    def _tag(self, mac_key: bytes, nonce: bytes, body: bytes) -> bytes:
        bound = PREFIX.encode() + len(self._model).to_bytes(4, "big") + self._model
        return hmac.digest(mac_key, bound + nonce + body, "sha256")

    def seal(self, text: str, nonce: bytes | None = None) -> str:
        enc_key, mac_key = self._derived()
        nonce = os.urandom(_NONCE) if nonce is None else nonce
        plain = text.encode()
        body = bytes(
            a ^ b for a, b in zip(plain, _keystream(enc_key, nonce, len(plain)), strict=True)
        )
        raw = nonce + body + self._tag(mac_key, nonce, body)
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def unseal(self, blob: str) -> str:
        if not blob.startswith(PREFIX):
            raise SealError("it was not produced by this server")
        encoded = blob[len(PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except ValueError:
            raise SealError("it is not valid base64url") from None
        if base64.urlsafe_b64encode(raw).decode().rstrip("=") != encoded:
            # Base64's last character carries unused bits: a changed one must not pass.
            raise SealError("it is not the canonical base64url of a sealed blob")
        if len(raw) < _NONCE + _TAG:
            raise SealError("it is truncated")
        nonce, body, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        enc_key, mac_key = self._derived()
        if not hmac.compare_digest(tag, self._tag(mac_key, nonce, body)):
            raise SealError("its authentication tag does not match (altered, or sealed elsewhere)")
        plain = bytes(
            a ^ b for a, b in zip(body, _keystream(enc_key, nonce, len(body)), strict=True)
        )
        try:
            return plain.decode()
        except UnicodeDecodeError:  # pragma: no cover - authenticated, so never in practice
            raise SealError("it does not hold text") from None


def secret_from_text(secret: str) -> bytes:
    """A configured secret string -> key bytes."""
    return hashlib.sha256(secret.encode()).digest()


def open_sealed(items: tuple[InputItem, ...], sealer: Sealer | None) -> tuple[InputItem, ...]:
    """A request's input with every sealed reasoning item opened: a blob alone (``content:
    null``, as Codex replays it) renders exactly as the full text did. A blob this server did
    not seal is a 400 naming ``input[i].encrypted_content``, whether or not text came with it."""
    if sealer is None:
        return items
    opened: list[InputItem] = []
    for i, item in enumerate(items):
        if isinstance(item, Reasoning) and item.encrypted is not None:
            try:
                text = sealer.unseal(item.encrypted)
            except SealError as exc:
                raise sealed_content_error(f"input[{i}].encrypted_content", str(exc)) from None
            item = Reasoning(item.text or text, item.encrypted)
        opened.append(item)
    return tuple(opened)
