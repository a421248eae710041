"""Fallback's probes (`peagle_vllm.depth.probes`): spaced by their cost, backed off where they keep losing."""

from __future__ import annotations

import pytest

from peagle_vllm.depth.probes import MAX_BACKOFF, PROBE_BUDGET, ProbeSchedule, trial_cost
from peagle_vllm.depth.regime import DepthController, DepthOptions
from peagle_vllm.depth.speeds import TIE, Speed
from peagle_vllm.depth.step import Step
from tests.unit.depth.scripted import batch_steps, decode_alone


def _speeds(plain_s: float, plain_tokens: float, spec_s: float, spec_tokens: float) -> tuple[Speed, Speed]:
    plain, spec = Speed(), Speed()
    plain.add(plain_tokens, 1, plain_s)
    spec.add(spec_tokens, 1, spec_s)
    return plain, spec


def test_a_trial_costs_its_timed_steps_loss_and_the_switches() -> None:
    """A speculative step lasting 5 plain steps and yielding the tokens of 4: each timed step loses 5 x (1 - 4/5) = 1
    plain step, the switches 5 together; speculation faster loses only the switches; nothing measured, no cost."""
    assert trial_cost(_speeds(0.01, 1, 0.05, 4), timed_steps=4) == pytest.approx(4 * 1 + 5)
    assert trial_cost(_speeds(0.01, 1, 0.02, 4), timed_steps=4) == pytest.approx(2)
    assert trial_cost(None, timed_steps=4) is None


def test_probes_are_spaced_by_the_budget_within_bounds_and_back_off_per_probe_lost() -> None:
    probes = ProbeSchedule(probe_every=16)
    probes.enter_fallback(100, key=1, batch=1, lost=8.0)  # 8 plain steps lost at 2% of the time: every 400
    assert (probes.interval, probes.next, probes.earliest) == (400, 500, 300)
    probes.enter_fallback(100, key=3, batch=4, lost=8.0)  # beyond batch 1 at 0.5%, at most 64x probe_every
    assert probes.interval == 1024 and probes.early_interval == 400 and PROBE_BUDGET == (0.02, 0.005)
    probes.enter_fallback(100, key=3, batch=4, lost=None)  # nothing measured: probe_every
    assert probes.interval == 16
    for lost_in_a_row in range(1, MAX_BACKOFF + 3):
        probes.open_stretch(3)
        probes.credit(gained=TIE * 0.1, seconds=0.1)  # a tie is lost
        probes.enter_fallback(100, key=3, batch=4, lost=0.04)
        assert probes.lost == {3: lost_in_a_row}
        assert probes.interval == 16 * 2 ** min(lost_in_a_row, MAX_BACKOFF)
    probes.open_stretch(3)
    probes.credit(gained=0.02, seconds=0.1)
    probes.enter_fallback(100, key=3, batch=4, lost=0.04)
    assert probes.lost == {3: 0} and probes.interval == 16, "a probe that gained ends the row"


def test_plain_decoding_measured_slower_brings_the_probe_forward_by_half_the_interval_at_most() -> None:
    probes = ProbeSchedule(probe_every=16)
    probes.enter_fallback(100, key=1, batch=1, lost=8.0)
    probes.bring_forward(120)
    assert probes.next == 300 and not probes.due(299) and probes.due(300)
    probes.bring_forward(290)
    assert probes.next == 300


def test_new_request_that_starts_at_zero_is_still_probed() -> None:
    ctrl = DepthController(DepthOptions(max_k=8, probe_every=4))
    ctrl.costs[False]._s[1] = 10.0  # verification looks prohibitively dear at first, and is about as dear as it gains
    ks = decode_alone(ctrl, alpha=0.9, steps=40, c1=10.0, req="fresh")
    assert ks[0] == 0 and ks.count(0) >= 25 and max(ks) > 0


def test_a_probe_starts_where_speculation_last_stood() -> None:
    """A probe measures the K speculation would run at, not a token draft that grows over the probe;
    it comes after the steps whose time its cost is 2% of."""
    ctrl = DepthController(DepthOptions(max_k=4, probe_every=8))
    for _ in range(20):
        ctrl.observe(["r"], [4], [4])
    ctrl.observe_step(Step(tokens=1, draft_rows=0, seconds=0.01, requests=1, emitted=1))  # plain: 100 tokens/s
    ks = []
    for _ in range(500):  # every draft is accepted, but a step costs 11 ms a token: 91 tokens/s, slower by 9%
        (k,) = ctrl.choose(["r"], [ctrl.reservation("r")])
        ks.append(k)
        if k:
            ctrl.observe(["r"], [k], [k])
        ctrl.observe_step(Step(tokens=1 + k, draft_rows=k, seconds=0.011 * (1 + k), requests=1, emitted=1 + k,
                               verified=k) if k else Step(tokens=1, draft_rows=0, seconds=0.01, requests=1, emitted=1))
    trial = ks.index(0)
    assert 4 <= trial <= 6 and ks[trial - 1] == 4, "the opening trial times 4 steady steps, then falls back"
    probe = trial + next(i for i, k in enumerate(ks[trial:]) if k)
    # a K=4 step lasts 5.5 plain steps: 4 timed steps lose 4 x 5.5 x 0.09 plain steps, the switches 5.5
    assert 340 < probe - trial < 420, "a probe costing 7.5 plain steps comes after some 375 (2%)"
    assert ks[probe] >= ks[trial - 1], "the probe drafts as deep as speculation went"


def test_a_slow_spell_of_the_machine_does_not_keep_a_losing_speculation_going() -> None:
    """Speculation is 9% slower; in fallback the machine slows down by half (every step) for a spell of
    2 to 48 steps. Plain steps timed in the spell look slower than speculation did before it: that
    stale figure must not start speculation, and a speculation started meanwhile (by a trial) must end
    soon after the spell, once plain decoding is timed afresh. (Before: for some spell lengths
    speculation ran on for hundreds of steps, compared against a plain figure timed in the spell.)"""
    for end in range(42, 90, 2):
        ctrl = DepthController(DepthOptions(max_k=32, probe_every=8))
        for _ in range(20):
            ctrl.observe(["r"], [8], [8])
        ks = []
        for i in range(end + 300):
            slow = 2.0 if 40 <= i < end else 1.0
            (k,) = ctrl.choose(["r"], [ctrl.reservation("r")])
            ks.append(k)
            if k:
                ctrl.observe(["r"], [k], [k])
            ctrl.observe_step(Step(tokens=1 + k, draft_rows=k, seconds=slow * 0.011 * (1 + k), requests=1,
                                   emitted=1 + k, verified=k) if k else
                              Step(tokens=1, draft_rows=0, seconds=slow * 0.01, requests=1, emitted=1))
        assert all(k == 0 for k in ks[10:40]), "fell back after the opening trial"
        assert sum(k > 0 for k in ks[end:]) <= 40, f"spell of {end - 40} steps: speculation went on after it"


def _probe_gaps(drafted: list[int]) -> list[int]:
    """Steps between the starts of successive stretches of verification (probes)."""
    starts = [i for i, v in enumerate(drafted) if v and (i == 0 or not drafted[i - 1])]
    return [b - a for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("batch", [1, 4])
def test_beyond_batch_one_each_probe_lost_in_a_row_doubles_the_interval(batch: int) -> None:
    """Speculation always loses: beyond batch 1 the gaps between probes double up to 8x (a trial costs more
    there than its steps); after speculation wins again, a later fallback starts the backoff afresh; at batch 1
    the gaps stay alike."""
    ctrl = DepthController(DepthOptions(max_k=4, probe_every=8))
    ids = [f"r{i}" for i in range(batch)]
    batch_steps(ctrl, ids, 20, plain_s=0.01 * batch, spec_s=0.1 * batch)
    interval = ctrl.probes.interval  # set by the opening trial's fallback (not a probe: no backoff)
    gaps = _probe_gaps(batch_steps(ctrl, ids, 13000, plain_s=0.01 * batch, spec_s=0.1 * batch))
    if batch == 1:
        assert len(gaps) > 20 and all(abs(g - interval) <= 8 for g in gaps), (gaps, interval)
        return
    assert [round(g / interval) for g in gaps] == [2, 4, 8, 8], (gaps, interval)
    batch_steps(ctrl, ids, 4200, plain_s=0.01 * batch, spec_s=0.002 * batch)  # the next probe wins
    assert ctrl.speculating
    batch_steps(ctrl, ids, 1200, plain_s=0.01 * batch, spec_s=0.1 * batch)  # an exploration, one probe lost
    assert ctrl.probes.lost == {3: 1} and ctrl.probes.interval == 2 * interval


def test_a_probe_whose_stretch_loses_on_balance_is_lost_though_its_trial_won() -> None:
    """Beyond batch 1 a probe's trial wins on its first steps, then speculation runs slower than plain decoding
    until it falls back, after the trial's last step: the stretch lost time on balance, so the backoff goes on
    growing (counted by the trial's outcome alone, it started afresh: a trial won by noise reset it)."""
    ctrl = DepthController(DepthOptions(max_k=4, probe_every=8))
    ids = ["a", "b", "c", "d"]
    batch_steps(ctrl, ids, 3000, plain_s=0.04, spec_s=0.4)
    lost = ctrl.probes.lost[3]
    assert lost >= 2 and not ctrl.speculating, "the premise: probes lost in a row"
    spec_steps, last, gained = 0, 0, 0.0
    while not spec_steps or ctrl.speculating:
        caps = [ctrl.reservation(r, len(ids)) for r in ids]
        ks = ctrl.choose(ids, caps)
        last = ctrl.steps if ctrl.speculating else last
        ctrl.observe(ids, ks, ks)
        seconds = 0.04
        if max(caps):  # a speculative step: 1.05x plain decoding's speed, then 0.8x from the 17th
            spec_steps += 1
            seconds = 0.19 if spec_steps <= 16 else 0.25
            gained += (4 + sum(ks)) * 0.04 / 4 - seconds
        ctrl.observe_step(Step(tokens=4 + sum(ks), draft_rows=max(caps) * 4, seconds=seconds, requests=4,
                               emitted=4 + sum(ks), verified=sum(ks)))
    assert last > ctrl.probe_until and gained < 0, "the premise: the trial ended speculating, the stretch lost"
    assert ctrl.probes.lost[3] == lost + 1
