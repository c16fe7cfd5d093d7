"""The generation thread's inbound stream: every message it is told, as plain frozen data.

Invariants:
- Everything the thread does to the batch happens because of one of these messages, applied in
  the order they were sent. Nothing else reaches the thread: no callable, no shared object
  (a sequence's output slot travels with its ``Admit`` and is the thread's only way back to
  that sequence's consumer).
- A message is plain data: ``plain()`` drops the output slot, and what is left can be
  recorded, compared and sent to another process. A grammar travels as its llguidance text
  (``GrammarSpec``) and is compiled on the thread from that text (the ``Constraints`` cache
  serves the grammar the request compiled at admission); penalties and ``top_k`` travel as
  ``SamplingAdjust``. An image travels as the processor's arrays (``ImageInput``): the thread
  prefills from what its ``Admit`` carries, never from an object another thread holds. An
  image whose positions the prompt cache already holds for this prompt is recorded and
  broadcast without its pixels (``Batch.lookup`` decides, before the journal sees the
  ``Admit``): every rank and every replay holds the same cache, so none needs them.
- ``Step`` is a batch step. A free-running thread decides its own steps and writes them, with
  the messages it applied between them, to its journal; a lockstep thread steps only when told,
  so replaying a journal on one reproduces the batch exactly, step for step (a sharded model's
  rank 0 broadcasts that stream to the other ranks, ``distributed.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .penalties import SamplingAdjust
from .slot import SequenceSlot


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A constrained sequence's grammar: its kind and its llguidance text."""

    kind: str
    source: str


@dataclass(frozen=True, slots=True)
class PlainArray:
    """One NumPy array as plain bytes: picklable and comparable (``==``), as a journal needs."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


# What an image the prompt cache holds still carries: the multimodal positions of the prompt's
# later tokens are numbered with every image's grid, but no vision tower runs on it.
POSITION_ARRAYS = frozenset({"image_grid_thw"})


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt as the vision tower takes it (``model/vision.py``): its handle
    (the prompt writes its image tokens as ``-handle``), how many tokens one copy of it takes,
    and the image processor's arrays by name (``pixel_values``, ``image_grid_thw``)."""

    handle: int
    tokens: int
    arrays: tuple[tuple[str, PlainArray], ...]

    @property
    def has_pixels(self) -> bool:
        """Whether it carries what the vision tower takes (not so once the prompt cache held
        its positions: ``without_pixels``)."""
        return any(name not in POSITION_ARRAYS for name, _ in self.arrays)

    def without_pixels(self) -> ImageInput:
        """It as an ``Admit`` whose cached prefix covers its positions carries it: its
        handle, tokens and position arrays only (a few bytes instead of megabytes)."""
        kept = tuple((name, a) for name, a in self.arrays if name in POSITION_ARRAYS)
        return self if kept == self.arrays else replace(self, arrays=kept)


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """What one sequence generates from: its tokenized prompt and its settings."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    top_p: float
    # Logprobs of each generated token, with this many alternatives (None: not asked).
    top_logprobs: int | None = None
    seed: int | None = None
    grammar: GrammarSpec | None = None
    adjust: SamplingAdjust = field(default_factory=SamplingAdjust)
    # Text that ends the sequence with ``stop`` when generated (the matched text is not output).
    stop_texts: tuple[str, ...] = ()
    # The tenant: the prompt cache serves a sequence only from its own tenant's prefixes.
    owner: str = ""
    # Its prompt_cache_key: the tenant's cache keeps each key's latest entry (PrefixCache).
    cache_key: str | None = None
    # The images its prompt's negative ids stand for, one per handle (none: a text prompt).
    images: tuple[ImageInput, ...] = ()


@dataclass(frozen=True, slots=True)
class Admit:
    """Sender: the model actor, for an admitted sequence. Add it to the batch; its output goes
    to ``output`` (None: nobody reads it, as on a rank that only computes)."""

    seq_id: int
    spec: SequenceSpec
    output: SequenceSlot | None = field(default=None, compare=False, repr=False)
    # Set by the generation thread that met it with the prompt cache: the disk entry its
    # prefix was loaded from, which every other rank (or a replay) loads too.
    disk_key: tuple[int, ...] | None = None
    # Requests still on their way to the model as it was sent (an idle batch that gets this
    # sequence gathers while any is: ``thread.gather_bound``; ``Arrivals(0)`` ends that).
    arriving: int = 0

    def plain(self) -> Admit:
        return replace(self, output=None)


@dataclass(frozen=True, slots=True)
class Cancel:
    """Sender: the model actor. Drop a sequence wherever it is (queued, prefill, decode); it
    ends with ``cancelled``. No-op for a sequence the thread does not hold."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class StopMatched:
    """Sender: the model actor, for a consumer that found its sequence's end in the output (it
    has all it needs). The sequence ends with ``stop`` and what it computed stays in the prompt
    cache for the next turn, as when one of its stop texts matches. No-op for a sequence the
    thread does not hold."""

    seq_id: int


@dataclass(frozen=True, slots=True)
class ClearPromptCache:
    """Drop every prompt-cache entry (of every tenant)."""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Sender: the model actor's handle. ``count`` requests are on their way to the model
    (preparing their prompts): an idle batch that gets a sequence waits a little for them
    (``thread.gather_bound``). The latest count (this, or an ``Admit``'s ``arriving``) holds
    until the next; it is sent when a count the thread was told drops to none, and to a new
    thread."""

    count: int


@dataclass(frozen=True, slots=True)
class Step:
    """One batch step (at most one prefill chunk and one decode step). Written to a
    free-running thread's journal; obeyed by a lockstep thread, ignored by a free one."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Sender: the model actor at shutdown. Finish every sequence with ``shutdown`` and exit."""


Inbound = Admit | Cancel | StopMatched | ClearPromptCache | Arrivals | Step | Shutdown


def plain(message: Inbound) -> Inbound:
    """``message`` without its output slot: what a journal keeps."""
    return message.plain() if isinstance(message, Admit) else message
