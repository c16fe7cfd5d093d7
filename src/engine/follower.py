"""A follower rank: the generation thread alone, stepping on what rank 0 sends.

Invariants:
- A follower runs no HTTP, no actors and no stores: ``mlx-responses serve`` on a rank other
  than 0 loads its share of the model and runs a lockstep generation thread whose inbox is the
  broadcast from rank 0 (``distributed.Receiver``); nothing it computes is read here.
- It exits 0 after rank 0's ``Shutdown``, and non-zero, naming what it lost, when the thread
  ends with an error (rank 0 gone, a peer lost, a load that failed).
"""

from __future__ import annotations

import logging

from .outbound import Exited, FactStream, Loaded
from .thread import GenerationThread, ThreadSettings

log = logging.getLogger(__name__)


def run_follower(settings: ThreadSettings, rank: int) -> int:
    """Serve as follower ``rank`` until rank 0 shuts the model down; the exit status."""
    facts = FactStream()
    thread = GenerationThread(settings, facts)
    thread.start()
    while True:
        fact = facts.get()
        match fact:
            case Loaded(loaded, error):
                if loaded is None:
                    log.critical("rank %d could not load %s: %s", rank, settings.model_path, error)
                    return 1
                log.info("rank %d holds its share of %s; following rank 0", rank, loaded.path)
            case Exited(error):
                # What this rank did, to compare with rank 0's /metrics: identical in lockstep.
                done = facts.latest()
                log.info(
                    "rank %d: %d tokens generated, %d sequences finished, "
                    "%d cancelled, %d failed, %d prompt-cache hits",
                    rank,
                    done.tokens_generated,
                    done.sequences_finished,
                    done.sequences_cancelled,
                    done.sequences_failed,
                    done.prompt_cache.hits,
                )
                if error is not None:
                    log.critical("rank %d stopped: %s", rank, error)
                    return 1
                log.info("rank %d: rank 0 shut the model down", rank)
                return 0
            case _:
                pass  # Ended: nobody reads a follower's sequences
