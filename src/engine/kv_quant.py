"""``--kv-bits`` and ``--kv-group-size``: what the KV cache is quantized to (``kv_cache.py``
holds the caches). Pure: importing it loads no MLX, so the command line and the actors use it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What ``--kv-bits`` and ``--kv-group-size`` accept (mx.quantize's group sizes).
KV_BITS = (4, 8)
KV_GROUP_SIZES = (32, 64, 128)
DEFAULT_KV_GROUP_SIZE = 64


class KvQuantUnsupported(ValueError):
    """The model cannot read a quantized KV cache with these flags (its message names them)."""


@dataclass(frozen=True, slots=True)
class KvQuant:
    """``--kv-bits`` and ``--kv-group-size``."""

    bits: int
    group_size: int = DEFAULT_KV_GROUP_SIZE
