"""The engine's port: everything the actors use of the engine, in one place.

The generation thread meets Trio here and nowhere else: the inbound messages it takes in order
(``inbound.py``: ``Admit``, ``Cancel``, ``StopMatched``, ``Shutdown``, the arrivals count), the
whole-batch facts it sends back (``outbound.py``), each sequence's slot (``slot.py``: the
non-blocking outbox), the thread itself and what it is started with, and the values admission
needs (a grammar, the sampling adjustments). The actors import this module only, so the
engine's inside can change without them.
"""

from __future__ import annotations

from .constrain import CannotConstrain, Grammar
from .disk_tier import DEFAULT_DISK_BYTES, DEFAULT_TTL_SECONDS
from .inbound import (
    Admit,
    Arrivals,
    Cancel,
    GrammarSpec,
    Inbound,
    SequenceSpec,
    Shutdown,
    StopMatched,
)
from .kv_quant import KvQuant
from .loader import LoadedModel
from .outbound import BatchFact, Ended, Exited, FactStream, Loaded, ModelStatistics
from .penalties import sampling_adjust
from .prompt_cache import DEFAULT_MAX_ENTRIES
from .sizing import DeviceFacts, SizeFlags, Sizes, choose_sizes
from .slot import FinishReason, SequenceOutput, SequenceSlot
from .thread import GenerationThread, ThreadSettings
from .topology import Sharding
from .vision import ImageError

__all__ = [
    "DEFAULT_DISK_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL_SECONDS",
    "Admit",
    "Arrivals",
    "BatchFact",
    "Cancel",
    "CannotConstrain",
    "DeviceFacts",
    "Ended",
    "Exited",
    "FactStream",
    "FinishReason",
    "GenerationThread",
    "Grammar",
    "GrammarSpec",
    "ImageError",
    "Inbound",
    "KvQuant",
    "Loaded",
    "LoadedModel",
    "ModelStatistics",
    "SequenceOutput",
    "SequenceSlot",
    "SequenceSpec",
    "Sharding",
    "Shutdown",
    "SizeFlags",
    "Sizes",
    "StopMatched",
    "ThreadSettings",
    "choose_sizes",
    "sampling_adjust",
]
