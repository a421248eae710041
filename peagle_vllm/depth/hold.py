"""Steady fallback without a choice per step: the steps of a held batch only keep their time for the controller."""

from __future__ import annotations

from collections.abc import Collection

from peagle_vllm.depth.regime import DepthController
from peagle_vllm.depth.step import Step

HOLD_STEPS = 7  # steps a batch held in fallback goes without a choice at most


class FallbackHold:
    """Steps of a batch in steady fallback that skip the controller. After a choice that held its batch in fallback
    with nothing due (`DepthController.chose_quiet_fallback`), up to `HOLD_STEPS` following plain decode steps of the
    same batch are only kept (their time and emitted tokens) while the controller's clock advances; the first other
    step, or the schedule of one that may draft, gives them to the controller in order (`release`) before its own.
    Why: run after the model's forward has evicted them from the caches, a step's observation and choice cost a
    noticeable share of a short plain step. What it costs: a change in plain decoding's speed during a hold is seen
    at the next choice, up to `HOLD_STEPS` steps late (and a probe it brings forward comes that much later); where
    the speeds stay put, the controller probes at the same steps and ends in the same state as with a choice each
    step."""

    __slots__ = ("batch", "left", "kept", "sampled")

    def __init__(self) -> None:
        self.batch: frozenset[str] = frozenset()
        self.left = 0  # steps the batch may still be held
        self.kept: list[tuple[float, int]] = []  # (seconds, emitted tokens) of each held step
        self.sampled = False  # some request of the held batch samples (`Step.sampled`)

    def start(self, controller: DepthController, req_ids: list[str], sampled: bool = False) -> None:
        """After `choose` for this batch: it is held for the next `HOLD_STEPS` steps if that choice was a quiet one
        (none otherwise)."""
        self.left = HOLD_STEPS if controller.chose_quiet_fallback() else 0
        if self.left:
            self.batch, self.sampled = frozenset(req_ids), sampled

    def holds(self, scheduled: Collection[str], tokens: int) -> bool:
        """Whether a step that scheduled these requests and `tokens` tokens (and ran no draft) is one more plain
        decode step of the held batch."""
        return self.left > 0 and tokens == len(self.batch) and scheduled == self.batch

    def keep(self, controller: DepthController, seconds: float, emitted: int) -> None:
        """A held step (see `holds`): kept for the controller, whose clock advances."""
        self.kept.append((seconds, emitted))
        self.left -= 1
        controller.hold_step()

    def release(self, controller: DepthController) -> int:
        """The kept steps to the controller, in order; the hold ends. Returns how many there were."""
        n, batch = len(self.kept), len(self.batch)
        for seconds, emitted in self.kept:
            controller.observe_step(Step(tokens=batch, draft_rows=0, seconds=seconds, requests=batch, emitted=emitted,
                                         sampled=self.sampled))
        self.kept.clear()
        self.left = 0
        return n
