"""Steady fallback's held steps (`peagle_vllm.depth.hold`): kept for the controller, given to it in order."""

from __future__ import annotations

import numpy as np

from peagle_vllm.depth.hold import HOLD_STEPS, FallbackHold
from peagle_vllm.depth.regime import DepthController, DepthOptions
from peagle_vllm.depth.step import Step
from tests.unit.depth.engine import fallback_run
from tests.unit.depth.scripted import batch_steps


def _quietly_in_fallback() -> DepthController:
    """A controller whose latest choice held batch (a, b) in fallback with nothing due: speculation measured at a
    fifth of plain decoding's speed, the next probe far off."""
    ctrl = DepthController(DepthOptions(max_k=4))
    batch_steps(ctrl, ["a", "b"], 40, plain_s=0.01, spec_s=0.1)
    assert not ctrl.speculating and ctrl.chose_quiet_fallback(), "the premise"
    return ctrl


def test_a_quiet_fallback_holds_its_batch_for_hold_steps_plain_decode_steps_and_no_other() -> None:
    ctrl, hold = _quietly_in_fallback(), FallbackHold()
    hold.start(ctrl, ["a", "b"])
    assert hold.left == HOLD_STEPS and hold.batch == {"a", "b"}
    assert not hold.holds({"a"}, 1) and not hold.holds({"a", "c"}, 2), "another batch"
    assert not hold.holds({"a", "b"}, 3), "a step with more than one token a request (a prompt, or drafts)"
    steps = ctrl.steps
    for n in range(HOLD_STEPS):
        assert hold.holds({"a", "b"}, 2)
        hold.keep(ctrl, 0.01 + n / 1000, 2)
    assert not hold.holds({"a", "b"}, 2) and ctrl.steps == steps + HOLD_STEPS, "the clock advanced, the hold is over"


def test_released_steps_reach_the_controller_in_order_as_plain_steps() -> None:
    ctrl, hold = _quietly_in_fallback(), FallbackHold()
    hold.start(ctrl, ["a", "b"])
    seen: list[Step] = []
    observe_step = ctrl.observe_step
    ctrl.observe_step = lambda step: (seen.append(step), observe_step(step))
    hold.keep(ctrl, 0.02, 2)
    hold.keep(ctrl, 0.03, 2)
    assert hold.release(ctrl) == 2 and hold.release(ctrl) == 0
    assert seen == [Step(tokens=2, draft_rows=0, seconds=0.02, requests=2, emitted=2),
                    Step(tokens=2, draft_rows=0, seconds=0.03, requests=2, emitted=2)]
    assert hold.left == 0 and not hold.kept


def test_a_choice_that_may_draft_holds_nothing() -> None:
    ctrl, hold = DepthController(DepthOptions(max_k=4)), FallbackHold()
    ctrl.choose(["a", "b"])
    hold.start(ctrl, ["a", "b"])
    assert hold.left == 0 and not hold.holds(frozenset(), 0)


def test_a_batch_held_in_steady_fallback_leaves_the_controller_where_a_choice_each_step_does() -> None:
    """In steady fallback most steps skip the controller (`FallbackHold`: in the engine a step's observation and
    choice cost some 100 us after the model's forward evicted them from the caches); given the held steps in
    order, it probes at the same steps and ends with the same clock, speeds and cost fit."""
    rng = np.random.default_rng(5)
    plain_s = [float(s) for s in 0.01 * np.exp(0.1 * rng.standard_normal(1500))]  # as the engine times them
    each, drafted_each, _ = fallback_run(plain_s, spec_s=0.013, held=False)
    held, drafted_held, n_held = fallback_run(plain_s, spec_s=0.013, held=True)
    assert drafted_held == drafted_each and len(drafted_each) >= 3
    assert held.steps == each.steps and held.probes.next == each.probes.next
    assert held.costs[False]._xx == each.costs[False]._xx and held.costs[False]._xy == each.costs[False]._xy
    speeds = [[(p.value, s.value) for p, s in ctrl.speeds.buckets.values()] for ctrl in (held, each)]
    assert speeds[0] == speeds[1]
    assert n_held > 0.8 * len(plain_s)


def test_plain_decoding_timed_slower_during_a_hold_brings_the_probe_forward_at_most_hold_steps_later() -> None:
    """Plain steps that turn slower than speculation measured bring the next probe forward; a held batch sees
    it at its next choice, at most `HOLD_STEPS` steps late."""
    plain_s = [0.01] * 40 + [0.05] * 200
    _, drafted_each, _ = fallback_run(plain_s, spec_s=0.013, held=False)
    _, drafted_held, _ = fallback_run(plain_s, spec_s=0.013, held=True)
    first_each = next(s for s in drafted_each if s > 40)
    first_held = next(s for s in drafted_held if s > 40)
    assert first_each < 100 and first_each <= first_held <= first_each + HOLD_STEPS

