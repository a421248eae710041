"""What the controller is told of each engine step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Step:
    """One engine step as the scheduler saw it (slots, not frozen: one is made per engine step, and a frozen
    dataclass costs several times as much to construct)."""

    tokens: int  # target tokens computed (scheduled)
    draft_rows: int  # draft-head rows run (requests x draft depth; 0: no draft ran)
    seconds: float
    requests: int = 1  # requests in the batch
    emitted: int = 0  # tokens the step produced (accepted drafts + one per request)
    verified: int = 0  # drafts it verified
    sampled: bool = False  # some request of the step samples (temperature > 0): priced by a cost model of its own

    @property
    def decode_only(self) -> bool:
        """Every request computed one new token plus its drafts: no prompt (prefill) in the step, whose cost would
        say nothing about plain vs speculative decoding."""
        return self.tokens == self.requests + self.verified
