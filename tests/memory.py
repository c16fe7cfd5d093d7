"""Resident memory of this process (Linux ``/proc``), sampled on a thread of its own."""

from __future__ import annotations

import threading
from types import TracebackType


def resident_bytes() -> int:
    """This process's resident set size now, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class PeakGrowth:
    """``with PeakGrowth() as growth: ...`` then ``growth.bytes``: the peak resident size
    during the block minus the size at its start (sampled every few milliseconds)."""

    def __init__(self, interval: float = 0.002) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.start = 0
        self.peak = 0

    @property
    def bytes(self) -> int:
        return self.peak - self.start

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, resident_bytes())

    def __enter__(self) -> PeakGrowth:
        self.start = self.peak = resident_bytes()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())
