"""Measured speeds: tokens per request-second of recent steady plain and steady speculative steps, per batch size.

The cost model can be biased (costs that are not linear, overheads it cannot see), so these figures have the last
word between speculating and plain decoding. Per-request speed falls with the batch, so only like is compared with
like: batch sizes within a factor of two share a bucket. Plain figures have a short memory (their steps vary in
time only, and an engine's first steps are slow), speculative ones a longer one.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN_DECAY = 0.8  # weight of the past in a plain figure, per step: a few recent steps say what plain decoding costs
TIE = 0.05  # speeds within this fraction of each other are a tie: the current regime stays


def bucket(batch: int) -> int:
    """The speed bucket of a batch size: sizes within a factor of two share their figures."""
    return max(batch, 1).bit_length()


@dataclass(slots=True)
class Speed:
    """Tokens per request-second of one kind of step, from decayed sums (recent steps weigh more)."""

    decay: float = 0.9  # weight of the past per step (some 10 steps)
    tokens: float = 0.0
    request_seconds: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0

    def add(self, tokens: float, requests: int, seconds: float) -> None:
        """One step of `requests` requests that took `seconds` and yields `tokens`."""
        decay = self.decay
        self.tokens = self.tokens * decay + tokens
        self.request_seconds = self.request_seconds * decay + requests * seconds
        self.seconds = self.seconds * decay + seconds
        self.steps = self.steps * decay + 1.0

    @property
    def value(self) -> float | None:
        """Tokens per request-second; None before a step."""
        return self.tokens / self.request_seconds if self.request_seconds > 0 else None

    @property
    def step_seconds(self) -> float | None:
        """How long one such step lasts (recent steps weigh more)."""
        return self.seconds / self.steps if self.steps > 0 else None


class MeasuredSpeeds:
    """Per batch-size bucket (`bucket`): the speeds of steady plain and of steady speculative steps."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: dict[int, tuple[Speed, Speed]] = {}  # bucket -> (plain, speculative)

    def at(self, batch: int) -> tuple[Speed, Speed]:
        """(plain, speculative) figures of this batch size's bucket, made on first use."""
        key = bucket(batch)
        speeds = self.buckets.get(key)
        if speeds is None:
            speeds = self.buckets[key] = (Speed(PLAIN_DECAY), Speed())
        return speeds

    def measured(self, batch: int) -> tuple[Speed, Speed] | None:
        """The (plain, speculative) figures at about this batch size: its own bucket's once both are measured, else
        the nearest bucket's where both are, the larger of two as near (speculation gains less at larger batches,
        and a wrong speculation costs more than a wrong fallback); None before any bucket has both."""
        buckets = self.buckets
        own = buckets.get(bucket(batch))
        if own is not None and own[0].value is not None and own[1].value is not None:
            return own  # the common case (asked for at every step, in fallback too)
        measured = [b for b, (p, s) in buckets.items() if p.value is not None and s.value is not None]
        if not measured:
            return None
        return buckets[min(measured, key=lambda b: (abs(b - bucket(batch)), -b))]

    def rates(self, batch: int) -> tuple[float, float] | None:
        """(plain, speculative) tokens per request-second at about this batch size (see `measured`)."""
        speeds = self.measured(batch)
        return None if speeds is None else (speeds[0].value, speeds[1].value)

    def speculation_faster(self, batch: int, speculating: bool) -> bool | None:
        """Whether speculation measures faster than plain decoding at about this batch size; within `TIE` of each
        other the current regime (`speculating`) stands, since a switch costs a step each way; None before both
        are measured."""
        rates = self.rates(batch)
        if rates is None:
            return None
        plain, spec = rates
        if abs(spec - plain) <= TIE * plain:
            return speculating
        return spec > plain

    def plain_unmeasured(self, batch: int) -> bool:
        """No plain decode step has been timed at about this batch size yet (a new load level)."""
        speeds = self.buckets.get(bucket(batch))
        return speeds is None or speeds[0].value is None

    def time_speculation_afresh(self, key: int) -> None:
        """Bucket `key`'s speculative figure starts over (a trial times it anew)."""
        speeds = self.buckets.get(key)
        if speeds is not None:
            self.buckets[key] = (speeds[0], Speed())

    def time_plain_afresh(self, key: int) -> None:
        """Bucket `key`'s plain figure starts over (an exploration times it anew)."""
        if key in self.buckets:
            self.buckets[key] = (Speed(PLAIN_DECAY), self.buckets[key][1])

    def describe(self) -> str:
        """'lo-hi: plain/speculative' tokens per request-second for each bucket measured ('-': not yet)."""
        return ", ".join(f"{2 ** (b - 1)}-{2 ** b - 1}: {_rate(p.value)}/{_rate(sp.value)}"
                         for b, (p, sp) in sorted(self.buckets.items()))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
