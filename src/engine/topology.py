"""What a model split over several ranks is, as plain data: how it is split
(``Sharding``, a setting), and what rank 0 learnt at load (``Topology``: the ranks and their
memory) and counts while it serves (``Traffic``), for the start-up line, /health and /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["tensor", "pipeline"]

DEFAULT_RANK_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Sharding:
    """How the model is split: ``tensor`` (every layer over every rank, ``model.shard``) or
    ``pipeline`` (consecutive layers per rank, ``model.model.pipeline``)."""

    mode: Mode = "tensor"
    backend: str = "any"  # mx.distributed's backend: ring, jaccl, mpi, any
    rank_timeout: float = DEFAULT_RANK_TIMEOUT_SECONDS


# A rank's slots in a header: steps taken, sequences held, prompt-cache tokens served so far.
SLOTS_PER_RANK = 3


def header_length(size: int) -> int:
    """int32 slots in a packet's header on ``size`` ranks: the length, then each rank's steps,
    batch size and prompt tokens its prompt cache served (``distributed.py``)."""
    return 1 + SLOTS_PER_RANK * size


@dataclass(frozen=True, slots=True)
class RankBatch:
    """One rank's batch as it reported it at the latest exchange: the steps it had taken and
    the sequences its batch held after the last of them (a follower's view is one exchange old
    when it arrives, rank 0's is taken at the same point, so in lockstep the two are equal)."""

    steps: int = 0
    sequences: int = 0
    # Prompt tokens this rank's prompt cache has served since start: rank 0 decides each hit
    # (its lookup), every other rank must serve the same prefix from its shard of the entry,
    # so in lockstep this equals rank 0's and a different hit counts as diverged.
    cached_tokens: int = 0


@dataclass(slots=True)
class Traffic:
    """What the broadcast moved (rank 0): packets, steps and bytes, for /metrics and the bench,
    and every rank's batch as of the latest exchange (``batches``, replaced whole each time)."""

    packets: int = 0
    carrying: int = 0  # packets with messages (the others: a Step alone, a header)
    steps: int = 0
    bytes: int = 0
    seconds: float = 0.0
    batches: tuple[RankBatch, ...] = ()
    # Exchanges at which a rank's batch differed from rank 0's: 0 while the ranks are in step.
    diverged: int = 0


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank as the start-up line, /health and /metrics show it."""

    rank: int
    memory_bytes: int  # MLX's active memory on that rank after load (weights and buffers)


@dataclass(frozen=True, slots=True)
class Topology:
    """The sharded deployment as rank 0 sees it after load."""

    mode: Mode
    backend: str
    size: int
    ranks: tuple[RankInfo, ...]
    rank_timeout: float
    # Rank 0's broadcast so far (read unlocked by other threads: plain counters).
    traffic: Traffic | None = field(default=None, compare=False)

    def describe(self) -> str:
        memory = ", ".join(f"rank {r.rank} {r.memory_bytes / 1e6:.1f} MB" for r in self.ranks)
        return f"sharded over {self.size} ranks ({self.mode} parallel, {self.backend}): {memory}"

    def as_json(self, fatal: str | None = None) -> dict[str, Any]:
        """/health's ``distributed`` (``fatal``: why the sharded model stopped, if it did)."""
        state = "ok" if fatal is None else "failed"
        traffic = self.traffic or Traffic()
        batches = traffic.batches or tuple(RankBatch() for _ in self.ranks)
        return {
            "mode": self.mode,
            "backend": self.backend,
            "size": self.size,
            "state": state,
            "error": fatal,
            "rank_timeout_seconds": self.rank_timeout,
            "ranks": [
                {
                    "rank": r.rank,
                    "memory_bytes": r.memory_bytes,
                    "state": state,
                    "batch_sequences": b.sequences,
                    "steps": b.steps,
                    "prompt_cache_tokens_reused": b.cached_tokens,
                }
                for r, b in zip(self.ranks, batches, strict=True)
            ],
            "broadcast": {
                "steps": traffic.steps,
                "packets": traffic.packets,
                "packets_with_messages": traffic.carrying,
                "bytes": traffic.bytes,
                "seconds": round(traffic.seconds, 6),
                "header_bytes": 4 * header_length(self.size),
                "diverged": traffic.diverged,
            },
        }
