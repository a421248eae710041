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
# beyond batch 1, speeds whose difference is within this many standard errors of it are a tie too (noise alone
# makes some 5% of differences that large): on a noisy machine a few steps' figures must not switch the regime
NOISE_Z = 2.0


def bucket(batch: int) -> int:
    """The speed bucket of a batch size: sizes within a factor of two share their figures."""
    return max(batch, 1).bit_length()


@dataclass(slots=True)
class Speed:
    """Tokens per request-second of one kind of step, from decayed sums (recent steps weigh more), and how far
    that figure may be off: the spread of the steps' own rates, over the steps it rests on."""

    decay: float = 0.9  # weight of the past per step (some 10 steps)
    tokens: float = 0.0
    request_seconds: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0
    rates: float = 0.0  # decayed sums of each step's own rate and its square
    rates_squared: float = 0.0
    weights_squared: float = 0.0  # decayed (by decay squared) sum of the steps' squared weights

    def add(self, tokens: float, requests: int, seconds: float) -> None:
        """One step of `requests` requests that took `seconds` and yields `tokens`."""
        decay = self.decay
        self.tokens = self.tokens * decay + tokens
        self.request_seconds = self.request_seconds * decay + requests * seconds
        self.seconds = self.seconds * decay + seconds
        self.steps = self.steps * decay + 1.0
        rate = tokens / (requests * seconds)
        self.rates = self.rates * decay + rate
        self.rates_squared = self.rates_squared * decay + rate * rate
        self.weights_squared = self.weights_squared * decay * decay + 1.0

    @property
    def error(self) -> float | None:
        """Standard error of `value`: the steps' rates' weighted variance times the sum of their squared weights
        over their weights' squared sum (1/n for n equal weights); None before two steps."""
        steps = self.steps
        if steps <= 0 or steps * steps <= self.weights_squared * (1 + 1e-9):
            return None
        mean = self.rates / steps
        variance = max(self.rates_squared / steps - mean * mean, 0.0) * steps * steps / (steps * steps -
                                                                                          self.weights_squared)
        return (variance * self.weights_squared) ** 0.5 / steps

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

    def verdict(self, batch: int) -> int | None:
        """1 where speculation measures faster than plain decoding at about this batch size, -1 where slower, 0 a
        tie; None before both are measured. A tie: speeds within `TIE` of each other (a switch costs a step each
        way), or, beyond batch 1, within `NOISE_Z` standard errors of their difference (`Speed.error`; a figure of
        one step has none), where the noise of the steps timed could have made it. At batch 1 `TIE` alone: there
        each request's own trial times speculation afresh, and a wider tie would keep a losing speculation going
        for the rest of the request."""
        speeds = self.measured(batch)
        if speeds is None:
            return None
        plain, spec = speeds[0].value, speeds[1].value
        errors = [s.error for s in speeds]
        noise = NOISE_Z * sum(e * e for e in errors if e is not None) ** 0.5 if batch > 1 else 0.0  # (see above)
        if abs(spec - plain) <= max(TIE * plain, noise):
            return 0
        return 1 if spec > plain else -1

    def speculation_faster(self, batch: int, speculating: bool) -> bool | None:
        """Whether speculation measures faster than plain decoding at about this batch size (`verdict`), a tie
        keeping the current regime (`speculating`); None before both are measured."""
        verdict = self.verdict(batch)
        return None if verdict is None else speculating if verdict == 0 else verdict > 0

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


class SpeedsByKind:
    """`MeasuredSpeeds` of greedy batches and of batches with a sampled request, apart: a sampled step costs more, plain
    or speculative, so a plain figure timed on one kind must not judge speculation on the other."""

    __slots__ = ("kinds",)

    def __init__(self) -> None:
        self.kinds = {False: MeasuredSpeeds(), True: MeasuredSpeeds()}

    def __getitem__(self, sampled: bool) -> MeasuredSpeeds:
        return self.kinds[sampled]

    def describe(self) -> str:
        """Each measured kind's `MeasuredSpeeds.describe`."""
        return "; ".join(f"{'sampled' if sampled else 'greedy'} batches {speeds.describe()}"
                         for sampled, speeds in self.kinds.items() if speeds.buckets)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
