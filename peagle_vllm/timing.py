"""Device time of a code section without a host sync: CUDA events read once they have completed
(usually a step later), wall time elsewhere (CPU work is synchronous)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class SectionTimer:
    """Sums the time of each `section()` run; `take()` returns (runs, seconds) finished since the last take."""

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._runs = 0
        self._seconds = 0.0

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending.append((start, end))
            return
        t0 = time.perf_counter()
        yield
        self._seconds += time.perf_counter() - t0
        self._runs += 1

    def take(self) -> tuple[int, float]:
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.pop(0)
            self._seconds += start.elapsed_time(end) / 1e3
            self._runs += 1
        out = self._runs, self._seconds
        self._runs, self._seconds = 0, 0.0
        return out
