"""The KV bytes the running batch holds, read from its caches' sizes.

Called on the generation thread when the batch's statistics are built (after every step), so
it must be cheap: an array's ``nbytes`` is its shape times its dtype's size, known without
evaluating it, and nothing here waits on the device. It counts what the caches have allocated
(mlx-lm grows a KV cache 256 tokens at a time), queued sequences' reused prefixes included; on
a model split over ranks, this rank's share.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def batch_kv_bytes(generator: Any, alone: Sequence[Any] = ()) -> int:
    """Bytes of KV cache ``generator`` (a ``BatchGenerator``) holds: queued, prefilling and
    decoding sequences', and the layers of a sequence decoding ``alone`` outside it
    (``batch.py``); 0 where mlx-lm cannot say (a cache type without ``nbytes``)."""
    try:
        return int(generator.prompt_cache_nbytes) + sum(int(layer.nbytes) for layer in alone)
    except Exception:  # a measurement never fails a step
        log.debug("the batch's KV bytes could not be read", exc_info=True)
        return 0
