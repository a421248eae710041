"""Acceptance figures operators watch, from each engine step's spec-decode counts (plain Python):
per-step acceptance length, drafted tokens per request, per-position counts, and the block
acceptance rate over the last WINDOW steps with a health warning when it stays low; and the
engine-side figures (chosen K, fallbacks, draft time) carried from the engine core to the front end."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

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
        self._sums = (0, 0)  # accepted and drafted over the window, kept as steps enter and leave it
        self._low = False

    def observe(self, num_drafts: int, num_draft_tokens: int, num_accepted: int) -> StepFigures | None:
        """One engine step's counts (None when nothing was drafted in it)."""
        if num_drafts <= 0 or num_draft_tokens <= 0:
            return None
        accepted, drafted = self._sums
        if len(self.window) == self.window.maxlen:
            gone_accepted, gone_drafted = self.window[0]
            accepted, drafted = accepted - gone_accepted, drafted - gone_drafted
        self.window.append((num_accepted, num_draft_tokens))
        self._sums = accepted, drafted = accepted + num_accepted, drafted + num_draft_tokens
        rate = accepted / drafted
        warning = None
        full = len(self.window) == self.window.maxlen
        if full and rate < self.warn_below and not self._low:
            warning = (f"p_eagle block acceptance rate {rate:.1%} over the last {len(self.window)} steps is below "
                       f"{self.warn_below:.0%}: the head may not fit this traffic (retrain it on such prompts, or "
                       "lower num_speculative_tokens)")
        self._low = full and rate < self.warn_below
        return StepFigures(1.0 + num_accepted / num_drafts, num_draft_tokens / num_drafts, rate, warning)


ENGINE_PREFIX = "peagle:"  # keys of engine-side figures inside the stats message's dict


@dataclass
class EngineFigures:
    """Figures only the engine core knows (the K chosen per request, steps in fallback, draft forward
    times), summed over steps and drained into vLLM's per-step stats message for the front end (every
    CARRY_EVERY_S, see scheduler_hook). Whole numbers only: the message's dict that carries them is typed
    dict[str, int]; each draft forward's time rides under its own key, so the histogram gets every one."""

    chosen_k: dict[int, int] = field(default_factory=dict)  # K -> request-steps given that K
    steps_without_draft: int = 0  # every scheduled request in fallback: the head did not run
    draft_us: list[int] = field(default_factory=list)  # each draft forward's time, microseconds
    lookup_drafts: int = 0  # drafts that prompt lookup gave in place of the head's (within each request's K)

    def add_choices(self, ks: list[int]) -> None:
        if not any(ks):  # a step in fallback (most steps at larger batches): one count
            self.add_fallback(len(ks))
            return
        chosen = self.chosen_k
        for k in ks:  # (a Counter cost 16 us a step in the engine at batch 1)
            chosen[k] = chosen.get(k, 0) + 1

    def add_fallback(self, requests: int) -> None:
        """A step with all these requests at K=0."""
        self.chosen_k[0] = self.chosen_k.get(0, 0) + requests

    def add(self, other: EngineFigures) -> None:
        """Sums other figures into these."""
        for k, n in other.chosen_k.items():
            self.chosen_k[k] = self.chosen_k.get(k, 0) + n
        self.steps_without_draft += other.steps_without_draft
        self.draft_us.extend(other.draft_us)
        self.lookup_drafts += other.lookup_drafts

    def add_draft(self, forwards: int, seconds: float) -> None:
        """A step's draft time, `forwards` forwards in `seconds` (each counted at their mean)."""
        self.draft_us.extend([round(1e6 * seconds / forwards)] * forwards if forwards else [])

    def drain(self) -> dict[str, int]:
        """The figures since the last drain as `peagle:`-prefixed keys (empty when nothing happened); resets."""
        out = {f"{ENGINE_PREFIX}k={k}": n for k, n in sorted(self.chosen_k.items())}
        if self.steps_without_draft:
            out[ENGINE_PREFIX + "steps_without_draft"] = self.steps_without_draft
        if self.lookup_drafts:
            out[ENGINE_PREFIX + "lookup_drafts"] = self.lookup_drafts
        out.update((f"{ENGINE_PREFIX}draft_us.{i}", us) for i, us in enumerate(self.draft_us))
        self.chosen_k, self.steps_without_draft, self.draft_us, self.lookup_drafts = {}, 0, [], 0
        return out

    @classmethod
    def take_from(cls, carrier: dict[str, int]) -> EngineFigures | None:
        """Removes our keys from `carrier` (vLLM's own readers must never see them) and rebuilds the
        figures; None when it held none."""
        ours = {key: carrier.pop(key) for key in [k for k in carrier if k.startswith(ENGINE_PREFIX)]}
        if not ours:
            return None
        fig = cls()
        for key, value in ours.items():
            name = key.removeprefix(ENGINE_PREFIX)
            if name.startswith("k="):
                fig.chosen_k[int(name[2:])] = value
            elif name.startswith("draft_us."):
                fig.draft_us.append(value)
            else:
                setattr(fig, name, value)
        return fig
