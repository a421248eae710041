"""Fallback's probe schedule: when a trial of speculation comes next, spaced by what one costs at the measured speeds.

A probe costs its timed steps at the measured loss, plus the two switches; spaced so that probing takes about
`PROBE_BUDGET` of the time, a clear loss is probed less often than a near tie. Beyond batch 1, probes lost in a row
at one load back off further (`MAX_BACKOFF`).
"""

from __future__ import annotations

import numpy as np

from peagle_vllm.depth.speeds import TIE, Speed

# share of the time probes may cost while plain decoding measures faster, at batch 1 and beyond: at batch 1
# speculation gains most, and a request that a slow spell sent into fallback is lost for long; beyond, a probe's
# cost falls on the whole batch
PROBE_BUDGET = (0.02, 0.005)
# beyond batch 1, each probe in a row at one batch-size bucket whose stretch of speculation gained no more than a
# tie doubles the next interval, up to 2**MAX_BACKOFF times: a trial there costs more than its own steps (the
# requests it sped up fall out of step with the rest), and where speculation keeps losing, each probe says so again
MAX_BACKOFF = 3


def trial_cost(measured: tuple[Speed, Speed] | None, timed_steps: int) -> float | None:
    """Plain steps a trial of `timed_steps` steps loses at these measured (plain, speculative) speeds; None before
    both are measured. A speculative step lasts `stretch` plain steps and yields the tokens of spec/plain of them:
    each timed step loses stretch x (1 - spec/plain) plain steps, the opening step (it drafts, verifies nothing)
    stretch - 1, and the first plain step after it about one."""
    if measured is None:
        return None
    plain, spec = measured
    stretch = max(spec.step_seconds / plain.step_seconds, 1.0)
    return timed_steps * stretch * max(1.0 - spec.value / plain.value, 0.0) + stretch


class ProbeSchedule:
    """The next probe's step, the intervals it is set by, and the backoff of probes lost in a row."""

    __slots__ = ("probe_every", "interval", "early_interval", "next", "earliest", "lost", "stretch")

    def __init__(self, probe_every: int) -> None:
        self.probe_every = probe_every
        self.interval = probe_every  # steps from entering fallback to the next probe
        self.early_interval = probe_every  # the same at PROBE_BUDGET[0]: sets the earliest probe
        self.next = probe_every  # step of the next probe
        self.earliest = probe_every // 2  # the next probe comes no earlier (see `schedule`)
        self.lost: dict[int, int] = {}  # per batch-size bucket beyond 1: probes lost in a row there
        # the latest probe beyond batch 1: its bucket, and the seconds its stretch of speculation gained and took so
        # far (None once that stretch is over)
        self.stretch: tuple[int, float, float] | None = None

    def due(self, step: int) -> bool:
        return step >= self.next

    def schedule(self, now: int) -> None:
        """The next probe one interval from now; plain decoding measured slower than speculation last was brings it
        forward (`bring_forward`), but by half the interval at most: a plain figure timed in a slow spell of the
        machine would otherwise call trial after trial."""
        self.next = now + self.interval
        self.earliest = now + self.early_interval // 2

    def bring_forward(self, now: int) -> None:
        """Speculation measures faster than plain decoding now: the next probe as soon as allowed."""
        self.next = min(self.next, max(now + self.probe_every, self.earliest))

    def open_stretch(self, key: int) -> None:
        """A probe beyond batch 1 begins in bucket `key`: what its stretch of speculation gains is measured."""
        self.stretch = (key, 0.0, 0.0)

    def credit(self, gained: float, seconds: float) -> None:
        """A step of the probe's stretch took `seconds` and gained `gained` over plain decoding."""
        if self.stretch is not None:
            key, stretch_gained, stretch_seconds = self.stretch
            self.stretch = (key, stretch_gained + gained, stretch_seconds + seconds)

    def close_stretch(self) -> None:
        """On leaving speculation: the latest probe's stretch is over. Unless it gained more than `TIE` of its time
        (plain time for its tokens less its own, its opening step included), it is one more probe lost in a row at its
        bucket; one that did ends the row. The whole stretch is judged, not its trial alone: a trial won by the
        noise of a few steps must not restart the backoff."""
        if self.stretch is not None:
            key, gained, seconds = self.stretch
            self.lost[key] = self.lost.get(key, 0) + 1 if gained <= TIE * seconds else 0
            self.stretch = None

    def enter_fallback(self, now: int, key: int, batch: int, lost: float | None) -> None:
        """Speculation ends now, at this batch (bucket `key`), where a trial loses `lost` plain steps
        (`trial_cost`): the first probe one interval later, backed off by the probes lost in a row there."""
        self.close_stretch()
        backoff = 2 ** min(self.lost.get(key, 0), MAX_BACKOFF)
        self.interval = backoff * self._interval(lost, PROBE_BUDGET[batch > 1])
        # the early probe, when speculation measures faster, comes as soon as at batch 1's budget
        self.early_interval = backoff * self._interval(lost, PROBE_BUDGET[0])
        self.schedule(now)

    def _interval(self, lost: float | None, budget: float) -> int:
        """Steps in fallback so that a trial losing `lost` plain steps costs `budget` of the time; within 1x-64x
        `probe_every`."""
        if lost is None:
            return self.probe_every
        return int(np.clip(lost / budget, self.probe_every, 64 * self.probe_every))
