"""One model sharded over several ranks: the broadcast of the inbound stream.

Invariants:
- Every rank runs the same generation thread over the same batch. Rank 0's thread is the free
  one (the model actor drives it); it writes every message it applies, and a ``Step`` before
  every step, to its journal (``thread.py``). Here that journal is a ``Broadcaster``: at each
  ``Step`` (and at ``Shutdown``) it sends what it gathered since the last one to every other
  rank, before rank 0 takes the step. A follower's thread is a lockstep thread whose inbox is a
  ``Receiver``: it receives the same messages in the same order and steps when told. So every
  rank inserts, removes, reuses the prompt cache and samples identically: all decisions (when
  to step, which sequences join, prompt-cache hits) are made once, on rank 0, and the batch is
  a function of its messages (``batch.py``'s last invariant).
- The collectives run on the generation thread only (MLX arrays belong to it), in the same
  order on every rank: a packet is one ``all_sum`` of its header (a ``Step`` alone is the
  length -1 and nothing else) and, when it carries more, one ``all_sum`` of its bytes, which
  the followers join with zeros. ``Arrivals`` is rank 0's own business and is not sent. A
  packet also goes out at an ``Admit`` that carries an image's pixels: its image prefill runs
  collectives as the Admit is applied, so every rank must hold it first (an image the prompt
  cache holds travels without its pixels, ``Batch.lookup``, and is not prefilled). Once
  the batch exists they run on its stream (``Link.stream``), behind the model's own.
- The header is a small int32 vector: the length (rank 0 writes it, the others 0), then one
  slot triple per rank in which that rank alone writes its steps taken, its batch's size after
  the last of them and the prompt tokens its prompt cache has served (``Link.batch``). So rank 0 learns every rank's batch at every exchange at
  no extra collective; a follower's figures are as of the step before, as are rank 0's own, so
  in lockstep they are equal and any difference is counted (``Traffic.diverged``).
- Nothing that depends on time or on the machine may change what a rank computes: the random
  seed and the prompt cache's bounds are rank 0's (``open_link``, ``thread.py``), OpenBLAS is
  not calibrated (a timed number of passes), and cache entries count as whole (``PromptCache``
  share), so every rank evicts alike.
- Rank 0 falling idle sends what it applied since its last step (a packet without a ``Step``:
  a cancel that emptied the batch) and a heartbeat, so no rank holds an ended sequence while
  the server waits for the next request, and rank 0 sees every rank's batch empty at once.
- Faults are loud and bounded: a collective that fails (a peer's connection is lost) raises on
  the thread, which ends every sequence with ``error``; an exchange or step that does not end
  within ``Sharding.rank_timeout`` seconds is reported by the ``Watchdog`` as an ``Exited`` fact
  naming the ranks that did not answer. The exchanges of start-up are not timed (they last as
  long as the slowest rank takes to load). Either way the server stops
  non-zero (``actors/model.py``); followers exit non-zero when rank 0 is gone. An idle rank 0
  sends a heartbeat every third of the timeout, so a follower times its wait for rank 0 too,
  and a rank lost while nothing runs is found then, not at the next request.
- Messages travel pickled: the ranks are one deployment that trusts itself, as mlx-lm's
  server does (its ranks share requests the same way).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .inbound import Admit, Arrivals, Inbound, Shutdown, Step
from .outbound import Exited, FactStream
from .topology import (
    SLOTS_PER_RANK,
    RankBatch,
    RankInfo,
    Sharding,
    Topology,
    Traffic,
    header_length,
)

log = logging.getLogger(__name__)


# The length that says "a Step and nothing else": most steps of a running batch.
_STEP_ONLY = -1
# The length that says "rank 0 is idle and alive" (every third of the rank timeout): followers
# time their wait for rank 0 too, and rank 0 finds a lost rank while nothing runs.
_HEARTBEAT = -2


class RankLost(RuntimeError):
    """A rank stopped answering or its connection was lost: the sharded model cannot go on."""


def launched_rank() -> int | None:
    """This process's rank when ``mlx.launch`` started it (``MLX_RANK``), else None."""
    text = os.environ.get("MLX_RANK")
    if text is None or not text.strip().isdigit():
        return None
    return int(text)


def sharded_launch() -> bool:
    """Whether ``mlx.launch`` started this process as one rank of several (its environment
    names peers: a ring host file, a JACCL coordinator or a world size above one)."""
    if launched_rank() is None:
        return False
    world = os.environ.get("MLX_WORLD_SIZE", "")
    return bool(
        os.environ.get("MLX_HOSTFILE")
        or os.environ.get("MLX_JACCL_COORDINATOR")
        or (world.isdigit() and int(world) > 1)
    )


def backend_in_use(requested: str, env: Mapping[str, str]) -> str:
    """The backend to show: ``--distributed-backend any`` (the default) lets MLX pick, and the
    variables ``mlx.launch`` set for the rank say which it found (JACCL's coordinator or RDMA
    devices, the ring's host file, MPI's world); an explicit choice is shown as given."""
    if requested != "any":
        return requested
    if "MLX_JACCL_COORDINATOR" in env or "MLX_IBV_DEVICES" in env:
        return "jaccl"
    if "MLX_HOSTFILE" in env:
        return "ring"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        return "mpi"
    return requested


def topology(link: Link, sharding: Sharding, traffic: Traffic | None) -> Topology:
    """After load, on every rank in step: each rank's memory (in KiB on the wire)."""
    import mlx.core as mx

    kib = link.gather_ints(int(mx.get_active_memory()) // 1024)
    return Topology(
        sharding.mode,
        backend_in_use(sharding.backend, os.environ),
        link.size,
        tuple(RankInfo(rank, size * 1024) for rank, size in enumerate(kib)),
        sharding.rank_timeout,
        traffic,
    )


class Watchdog:
    """Times every collective of one thread; one that takes longer than ``limit`` seconds is
    reported once, as an ``Exited`` fact naming the ranks that did not answer (the thread may
    never return from it)."""

    def __init__(self, limit: float, facts: FactStream, rank: int, size: int) -> None:
        self._limit = limit
        self._facts = facts
        self._peers = [r for r in range(size) if r != rank]
        self._lock = threading.Lock()
        self._since: float | None = None
        self._fired = False
        self._thread = threading.Thread(target=self._watch, name="mlx-rank-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self) -> Iterator[None]:
        with self._lock:
            self._since = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(0.25, self._limit / 4))
            with self._lock:
                late = self._since is not None and time.monotonic() - self._since > self._limit
                if not late or self._fired:
                    continue
                self._fired = True
            names = " or ".join(f"rank {r}" for r in self._peers)
            error = RankLost(f"{names} did not answer within {self._limit:g} s")
            log.critical("sharded model: %s", error)
            self._facts.put(Exited(error))


def _lost(error: BaseException, rank: int, size: int) -> RankLost:
    peers = " or ".join(f"rank {r}" for r in range(size) if r != rank)
    return RankLost(f"lost {peers}: {error}")


class Link:
    """This rank's group and its packet exchange (generation thread only)."""

    def __init__(self, group: Any, watchdog: Watchdog | None, timeout: float | None = None) -> None:
        self.group = group
        # Rank 0 beats this often while idle (None: never; tests of the exchange alone).
        self.beat_seconds = None if timeout is None else timeout / 3
        self.rank: int = group.rank()
        self.size: int = group.size()
        self._watchdog = watchdog
        self.traffic = Traffic(batches=tuple(RankBatch() for _ in range(self.size)))
        # This rank's batch after its latest step: the thread sets it, each header carries it.
        self.batch = RankBatch()
        # The batch's stream once it exists. Every collective of a step must run on it: the
        # model's own (tensor all_sums, pipeline send/recv) run there, and mlx-lm evaluates
        # the next step asynchronously, so a collective on another stream could overtake or
        # trail them in a different order on each rank and pair with the wrong one.
        self.stream: Any = None

    def guard(self) -> AbstractContextManager[None]:
        """Time what runs inside against the rank timeout (rank 0: each exchange and step)."""
        return self._watchdog.guard() if self._watchdog is not None else nullcontext()

    def _all_sum(self, array: Any, *, idle: bool = False) -> Any:
        """``idle``: a wait that may rightly last, not timed: a follower waiting for rank 0's
        next packet (as long as the server has nothing to do), and the exchanges of start-up
        (as long as the slowest rank takes to load)."""
        import mlx.core as mx

        with nullcontext() if idle else self.guard():
            try:
                stream = mx.cpu if self.stream is None else self.stream
                result = mx.distributed.all_sum(array, group=self.group, stream=stream)
                mx.eval(result)
            except RuntimeError as exc:
                raise _lost(exc, self.rank, self.size) from exc
        return result

    def explain(self, error: BaseException) -> BaseException:
        """What ended this rank's thread, naming the lost ranks when a collective failed (the
        model's own, inside a step, raise MLX's words only)."""
        if isinstance(error, RankLost) or not any(
            f"[{name}]" in str(error) for name in ("ring", "jaccl", "mpi", "nccl")
        ):
            return error
        return _lost(error, self.rank, self.size)

    def _header(self, length: int, *, idle: bool = False) -> int:
        """Exchange a header (module header): every rank's batch into ``traffic.batches``;
        rank 0's ``length`` (the others pass 0) on every rank."""
        import mlx.core as mx

        mine = [0] * header_length(self.size)
        mine[0] = length
        at = 1 + SLOTS_PER_RANK * self.rank
        mine[at : at + SLOTS_PER_RANK] = [
            self.batch.steps,
            self.batch.sequences,
            self.batch.cached_tokens & 0x7FFFFFFF,  # int32 slots: a long-lived server wraps
        ]
        summed = self._all_sum(mx.array(mine, dtype=mx.int32), idle=idle).tolist()
        batches = tuple(
            RankBatch(*(int(v) for v in summed[1 + SLOTS_PER_RANK * r :][:SLOTS_PER_RANK]))
            for r in range(self.size)
        )
        traffic = self.traffic
        traffic.batches = batches
        traffic.diverged += any(b != batches[0] for b in batches)
        traffic.packets += 1
        traffic.bytes += 4 * len(mine)
        return int(summed[0])

    def send(self, payload: bytes | None) -> None:
        """Rank 0: a packet (None: a Step alone)."""
        import mlx.core as mx

        started = time.perf_counter()
        self._header(_STEP_ONLY if payload is None else len(payload))
        if payload is not None:
            import numpy as np

            self._all_sum(mx.array(np.frombuffer(payload, dtype=np.uint8)))
            self.traffic.bytes += len(payload)
            self.traffic.carrying += 1
        self.traffic.seconds += time.perf_counter() - started

    def beat(self) -> None:
        """Rank 0, idle: a heartbeat (a header and nothing else)."""
        self._header(_HEARTBEAT)

    def receive(self) -> bytes | None:
        """A follower: the next packet (None: a Step alone), heartbeats skipped. The wait is
        timed only where rank 0 beats (else it may rightly last as long as rank 0 is idle)."""
        import mlx.core as mx

        length = _HEARTBEAT
        while length == _HEARTBEAT:
            length = self._header(0, idle=self.beat_seconds is None)
        if length == _STEP_ONLY:
            return None
        data = self._all_sum(mx.zeros((length,), dtype=mx.uint8))
        self.traffic.bytes += length
        return memoryview(data).tobytes()

    def gather_ints(self, value: int) -> list[int]:
        """Every rank's ``value`` (below 2**31), in rank order (start-up only)."""
        import mlx.core as mx

        mine = mx.zeros((self.size,), dtype=mx.int32)
        mine[self.rank] = value
        return [int(v) for v in self._all_sum(mine, idle=True).tolist()]

    def from_rank0(self, value: int) -> int:
        """Rank 0's ``value`` (below 2**31) on every rank."""
        import mlx.core as mx

        mine = mx.array([value if self.rank == 0 else 0], dtype=mx.int32)
        return int(self._all_sum(mine, idle=True).item())

    def agree_seed(self, seed: int | None = None) -> None:
        """Every rank draws from the same random key sequence (unseeded sampling): rank 0's
        ``seed`` (``--seed``, below 2**31), or one from its clock."""
        import mlx.core as mx

        if self.rank != 0:
            seed = 0
        elif seed is None:
            seed = int(time.time_ns() % (1 << 31))
        mx.random.seed(int(self._all_sum(mx.array([seed], dtype=mx.int32), idle=True).item()))


class Broadcaster:
    """Rank 0's journal: gathers the messages its thread applies and sends them at each step."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._pending: list[Inbound] = []

    @property
    def traffic(self) -> Traffic:
        return self._link.traffic

    def put(self, message: Inbound) -> None:
        if isinstance(message, Arrivals):
            return  # how long rank 0 gathers a burst is its own decision
        if isinstance(message, Step) and not self._pending:
            self._link.traffic.steps += 1
            self._link.send(None)
            return
        self._pending.append(message)
        # An image's Admit computes as it is applied (its image prefill, whose collectives
        # every rank joins): it goes out before rank 0 applies it. One whose images the prompt
        # cache holds carries no pixels and computes nothing then.
        if isinstance(message, Step | Shutdown) or (
            isinstance(message, Admit) and any(i.has_pixels for i in message.spec.images)
        ):
            self._send()

    def flush(self) -> bool:
        """Rank 0 falls idle: send what it applied since its last step, if anything (a packet
        without a ``Step``: the followers apply it and wait). True if it sent."""
        if not self._pending:
            return False
        self._send()
        return True

    def _send(self) -> None:
        self._link.traffic.steps += isinstance(self._pending[-1], Step)
        payload = pickle.dumps(tuple(self._pending), protocol=pickle.HIGHEST_PROTOCOL)
        self._pending = []
        self._link.send(payload)


@dataclass(slots=True)
class Receiver:
    """A follower's inbox: the messages rank 0 applied, in order (``get`` blocks for the next
    packet on the calling thread, the generation thread)."""

    link: Link
    _queued: deque[Inbound] = field(default_factory=deque)

    def get(self, block: bool = True, timeout: float | None = None) -> Inbound:
        while not self._queued:
            payload = self.link.receive()
            if payload is None:
                self.link.traffic.steps += 1
                return Step()
            self._queued.extend(pickle.loads(payload))
        message = self._queued.popleft()
        traffic = self.link.traffic
        if isinstance(message, Step):
            traffic.steps += 1
        elif isinstance(message, Shutdown):
            log.info(
                "rank %d: rank 0 shut down after %d steps (%d packets, %d bytes received)",
                self.link.rank,
                traffic.steps,
                traffic.packets,
                traffic.bytes,
            )
        return message

    def get_nowait(self) -> Inbound:
        return self.get()

    def empty(self) -> bool:
        """Never: a follower's next message is always coming (``get`` blocks for it)."""
        return False

    def put(self, message: Inbound) -> None:
        """Nothing local reaches a follower's thread: everything comes from rank 0."""


def open_link(sharding: Sharding, facts: FactStream, seed: int | None = None) -> Link:
    """Join the group (on the generation thread) with a watchdog over its collectives; the
    ranks' random keys start at rank 0's ``seed`` (None: its clock's)."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend=sharding.backend)
    watchdog = Watchdog(sharding.rank_timeout, facts, group.rank(), group.size())
    link = Link(group, watchdog, sharding.rank_timeout)
    link.agree_seed(seed)
    return link


def shard_model(sharding: Sharding, group: Any, model: Any) -> tuple[int, int]:
    """Split ``model`` (lazily loaded) over ``group`` as ``sharding`` says, as mlx-lm's
    ``sharded_load`` does; a model class that cannot be split so is refused by name. Returns
    the whole over this rank's share (layers over local layers; the ranks, for tensors)."""
    # A vision-language model's text side (mlx-lm's ``qwen2_vl``) wraps the text model that
    # splits; its vision tower is never split (each rank holds it: ``vision.load_vision``).
    text = getattr(model, "language_model", None)
    if not hasattr(model, "shard") and not hasattr(model, "model") and text is not None:
        model = text
    if sharding.mode == "pipeline":
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "pipeline"):
            raise ValueError(
                f"{type(model).__module__} cannot be split by layers (pipeline); "
                "leave out --pipeline to split it by tensors"
            )
        total = len(inner.layers)
        inner.pipeline(group)
        return total, len(inner.pipeline_layers)
    if not hasattr(model, "shard"):
        raise ValueError(f"{type(model).__module__} cannot be split by tensors; try --pipeline")
    model.shard(group)
    return group.size(), 1
