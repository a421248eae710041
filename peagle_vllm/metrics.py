"""Acceptance figures operators watch, from each engine step's spec-decode counts (plain Python):
per-step acceptance length, drafted tokens per request, per-position counts, and the block
acceptance rate over the last WINDOW steps with a health warning when it stays low."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

WINDOW = 20


@dataclass
class StepFigures:
    acceptance_length: float  # 1 + accepted / drafts: tokens emitted per request-step
    draft_tokens_per_request: float  # the K actually verified (adaptive depth may cut it)
    window_rate: float  # accepted / drafted over the last WINDOW steps
    warning: str | None  # set once each time the window rate falls below the threshold


class AcceptanceMonitor:
    def __init__(self, warn_below: float = 0.75, window: int = WINDOW) -> None:
        if not 0.0 <= warn_below <= 1.0:
            raise ValueError(f"acceptance warning threshold must lie in [0, 1], got {warn_below}")
        self.warn_below = warn_below
        self.window: deque[tuple[int, int]] = deque(maxlen=window)
        self._low = False

    def observe(self, num_drafts: int, num_draft_tokens: int, num_accepted: int) -> StepFigures | None:
        """One engine step's counts (None when nothing was drafted in it)."""
        if num_drafts <= 0 or num_draft_tokens <= 0:
            return None
        self.window.append((num_accepted, num_draft_tokens))
        accepted = sum(a for a, _ in self.window)
        drafted = sum(d for _, d in self.window)
        rate = accepted / drafted
        warning = None
        full = len(self.window) == self.window.maxlen
        if full and rate < self.warn_below and not self._low:
            warning = (f"p_eagle block acceptance rate {rate:.0%} over the last {len(self.window)} steps is below "
                       f"{self.warn_below:.0%}: the head may not fit this traffic (retrain it on such prompts, or "
                       "lower num_speculative_tokens)")
        self._low = full and rate < self.warn_below
        return StepFigures(1.0 + num_accepted / num_drafts, num_draft_tokens / num_drafts, rate, warning)
