"""Measured speeds (`peagle_vllm.depth.speeds`): what is timed, by batch-size bucket, and how ties go."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peagle_vllm.depth.regime import DepthController, DepthOptions
from peagle_vllm.depth.speeds import TIE, MeasuredSpeeds, bucket
from peagle_vllm.depth.step import Step
from tests.unit.depth.scripted import time_speeds


def test_batch_sizes_within_a_factor_of_two_share_a_bucket() -> None:
    assert [bucket(b) for b in (0, 1, 2, 3, 4, 7, 8, 64)] == [1, 1, 2, 2, 3, 3, 4, 7]


def test_speeds_within_a_tie_keep_the_current_regime() -> None:
    """Tokens per request-second of each kind; within `TIE` of plain decoding's, the regime that runs stays."""
    speeds = MeasuredSpeeds()
    assert speeds.speculation_faster(4, speculating=True) is None, "nothing measured yet"
    plain, spec = speeds.at(4)
    plain.add(tokens=4, requests=4, seconds=0.01)  # 100 tokens per request-second
    assert speeds.speculation_faster(4, speculating=True) is None, "speculation not measured yet"
    spec.add(tokens=4 * (1 + TIE / 2), requests=4, seconds=0.01)
    assert speeds.rates(5) == pytest.approx((100.0, 100 * (1 + TIE / 2)))
    assert [speeds.speculation_faster(4, s) for s in (True, False)] == [True, False]
    speeds.time_speculation_afresh(bucket(4))
    for _ in range(2):  # now clearly faster, in steps that agree
        speeds.at(4)[1].add(tokens=4 * 1.5, requests=4, seconds=0.01)
    assert [speeds.speculation_faster(4, s) for s in (True, False)] == [True, True]


def test_beyond_batch_1_a_difference_within_the_steps_noise_is_a_tie() -> None:
    """Speculation 20% faster on average, but its steps' rates scatter by 50%: beyond batch 1 that is within
    `NOISE_Z` standard errors, a tie (the regime stays); the same steady steps, or at batch 1, decide."""
    speeds = MeasuredSpeeds()
    for batch in (1, 4):
        plain, spec = speeds.at(batch)
        for seconds in (0.01,) * 4:
            plain.add(tokens=batch, requests=batch, seconds=seconds)  # 100 tokens per request-second
        for tokens in (0.6, 1.8, 0.6, 1.8):  # 60 and 180: 120 on average
            spec.add(tokens=batch * tokens, requests=batch, seconds=0.01)
    assert speeds.at(4)[0].error == pytest.approx(0.0) and speeds.at(4)[1].error > 20
    assert [speeds.speculation_faster(4, s) for s in (True, False)] == [True, False]
    assert [speeds.speculation_faster(1, s) for s in (True, False)] == [True, True]
    speeds.time_speculation_afresh(bucket(4))
    for _ in range(4):
        speeds.at(4)[1].add(tokens=4 * 1.2, requests=4, seconds=0.01)
    assert [speeds.speculation_faster(4, s) for s in (True, False)] == [True, True]


def test_a_figure_s_error_is_the_standard_error_of_its_steps_rates() -> None:
    """Equal weights (no decay): the sample standard deviation over sqrt(n); none before two steps."""
    from peagle_vllm.depth.speeds import Speed

    speed = Speed(decay=1.0)
    speed.add(tokens=1.0, requests=1, seconds=1.0)
    assert speed.error is None
    for tokens in (2.0, 3.0):
        speed.add(tokens=tokens, requests=1, seconds=1.0)
    assert speed.error == pytest.approx(1.0 / 3 ** 0.5)  # rates 1, 2, 3: sd 1


def test_a_figure_timed_afresh_starts_over_and_a_plain_figure_forgets_quickly() -> None:
    speeds = MeasuredSpeeds()
    plain, spec = speeds.at(2)
    for seconds in (0.01, 0.01, 0.01, 0.02):
        plain.add(tokens=2, requests=2, seconds=seconds)
        spec.add(tokens=4, requests=2, seconds=seconds)
    assert plain.value < spec.value / 2, "plain figures weigh the latest step more"
    speeds.time_speculation_afresh(2)
    assert speeds.buckets[2][0] is plain and speeds.buckets[2][1].value is None
    assert not speeds.plain_unmeasured(3)
    speeds.time_plain_afresh(2)
    assert speeds.plain_unmeasured(3) and speeds.buckets[2][0] is not plain
    speeds.time_plain_afresh(5)  # a bucket never measured stays so
    assert list(speeds.buckets) == [2]


def test_switching_steps_are_not_timed_and_a_batch_between_two_measured_ones_goes_by_the_larger() -> None:
    ctrl = DepthController(DepthOptions(max_k=8))
    plain = Step(tokens=1, draft_rows=0, seconds=0.01, requests=1, emitted=1)
    opening = Step(tokens=1, draft_rows=8, seconds=0.03, requests=1, emitted=1)
    spec = Step(tokens=9, draft_rows=8, seconds=0.02, requests=1, emitted=3, verified=8)
    # timed: the first plain step, the second speculative one (the first follows the opening draft,
    # which the head made without the plain steps' KV) and the last plain one (the one before it
    # follows a draft); a speculative step is credited with the tokens its choice expected
    ctrl._expected = 3.0
    for step in (plain, opening, spec, spec, replace(plain, seconds=0.05), plain):
        ctrl.observe_step(step)
    assert ctrl.speeds.buckets[1][0].value == pytest.approx(100.0)
    assert ctrl.speeds.buckets[1][1].value == pytest.approx(150.0)
    ctrl._expected = 2.0
    for _ in range(3):  # batch 4: speculation measured at half the speed of plain decoding
        ctrl.observe_step(Step(tokens=4, draft_rows=0, seconds=0.01, requests=4, emitted=4))
        ctrl.observe_step(Step(tokens=36, draft_rows=32, seconds=0.04, requests=4, emitted=8, verified=32))
        ctrl.observe_step(Step(tokens=36, draft_rows=32, seconds=0.04, requests=4, emitted=8, verified=32))
    assert ctrl.speculation_measured_faster(1) is True and ctrl.speculation_measured_faster(4) is False
    assert ctrl.speculation_measured_faster(2) is False, "batch 2 lies as near batch 1 as batch 4: the larger decides"


def test_a_step_that_drafts_for_nothing_while_speculating_is_timed_as_speculation() -> None:
    """A choice of K=0 for every request while speculating still runs the head (the requests reserve drafts): its
    step costs a draft and yields one token a request, and speculation's figure counts it, as it does the step
    after it; only a switch's steps (the first draft after plain steps, the step after it) are left out."""
    ctrl = DepthController(DepthOptions(max_k=8))
    plain = Step(tokens=1, draft_rows=0, seconds=0.01, requests=1, emitted=1)
    draft_alone = Step(tokens=1, draft_rows=8, seconds=0.03, requests=1, emitted=1)  # nothing to verify
    spec = Step(tokens=9, draft_rows=8, seconds=0.02, requests=1, emitted=3, verified=8)
    # the first draft alone opens a switch (after a plain step); the second is a draft for nothing amid speculation
    for step, expected in ((plain, 1.0), (draft_alone, 1.0), (spec, 3.0), (spec, 3.0), (draft_alone, 1.0), (spec, 3.0)):
        ctrl._expected = expected
        ctrl.observe_step(step)
    # timed: the second speculative step (150 tokens a second), the draft for nothing (33) and the step after it
    speed = ctrl.speeds.buckets[1][1]
    d = speed.decay
    assert speed.steps == pytest.approx(1 + d + d * d)
    assert speed.value == pytest.approx((3 * d * d + 1 * d + 3) / (0.02 * d * d + 0.03 * d + 0.02))


def test_the_log_line_shows_the_measured_speeds_that_decide() -> None:
    """Operators see why the controller speculates or falls back: plain and speculative tokens per
    request-second by batch-size bucket (here 100 and 33 at batch 4, nothing measured yet elsewhere)."""
    ctrl = DepthController(DepthOptions(max_k=4))
    ctrl.choose(["a"])
    time_speeds(ctrl, 4, plain_s=0.01, spec_s=0.03)
    ctrl.observe_step(Step(tokens=1, draft_rows=0, seconds=0.01, requests=1, emitted=1))
    line = ctrl.summary()
    assert "4-7: 100/33" in line and "1-1: -/-" in line, line
