"""The draft-set optimiser (`peagle_vllm.depth.optimiser`): the K it picks, against a search of every candidate."""

from __future__ import annotations

import time

import numpy as np
import pytest

from peagle_vllm.depth import optimiser
from peagle_vllm.depth.acceptance import Acceptance, Counts, RequestStats
from peagle_vllm.depth.cost import CostModel
from peagle_vllm.depth.optimiser import REWEIGH_EVERY, REWEIGH_FROM, best_drafts
from peagle_vllm.depth.regime import DepthController, DepthOptions
from peagle_vllm.depth.step import Step
from tests.unit.depth.scripted import batch_steps, decode_alone


def test_k_rises_to_the_maximum_when_acceptance_is_high_and_cost_low() -> None:
    ctrl = DepthController(DepthOptions(max_k=32))
    ks = decode_alone(ctrl, alpha=0.97, steps=200, c1=0.005)
    assert np.mean(ks[-50:]) > 24


def test_expensive_verification_means_shallower_drafts() -> None:
    cheap = decode_alone(DepthController(DepthOptions(max_k=32)), alpha=0.8, steps=200, c1=0.002)
    dear = decode_alone(DepthController(DepthOptions(max_k=32)), alpha=0.8, steps=200, c1=0.3)
    assert np.mean(dear[-50:]) < np.mean(cheap[-50:])


def test_batch_shares_one_threshold_good_requests_get_deeper_drafts() -> None:
    # the prior's pull at the weight of one request alone: at the batch weight (8) "bad" is pulled to 0.36 a draft,
    # which the unfitted step cost still finds worth 15 drafts, so the rule under test would not show
    ctrl = DepthController(DepthOptions(max_k=16, batch_prior_weight=2.0))
    for _ in range(40):
        ctrl.observe(["good", "bad"], [16, 16], [15, 0])
    ctrl.observe_step(Step(tokens=2, draft_rows=0, seconds=0.01, requests=2, emitted=2))  # plain speed known
    good, bad = ctrl.choose(["good", "bad"])
    assert good > bad


def test_decision_cost_is_small() -> None:
    ctrl = DepthController(DepthOptions(max_k=32))
    ids = [f"r{i}" for i in range(256)]
    for rid in ids:
        ctrl.observe([rid], [32], [5])
    t0 = time.perf_counter()
    for _ in range(20):
        ctrl.choose(ids)
    per_step = (time.perf_counter() - t0) / 20
    print(f"choose() for 256 requests x K=32: {per_step * 1e3:.2f} ms")
    assert per_step < 0.05


def _speed_of(cost: CostModel, rows: list[int], curves: np.ndarray, threshold: float, depth: int) -> float:
    """Predicted tokens per second of a step keeping the drafts at most `depth` deep whose probability reaches
    `threshold` (threshold inf: a plain step)."""
    b = curves.shape[0]
    s0, sb, sv, s2, plain = cost.terms()
    if threshold == np.inf:
        return b / max(plain + sb * b, 1e-9)
    kept = curves[:, :depth][curves[:, :depth] >= threshold]
    seconds = s0 + s2 * b * rows[depth] + sb * b + sv * kept.size
    return (b + kept.sum()) / max(seconds, 1e-9)


def _best_speed_by_search(cost: CostModel, rows: list[int], curves: np.ndarray, speculate: bool) -> float:
    """The best speed over every depth and every threshold (each draft's probability: the drafts reaching it,
    ties included) that keeps a draft, and a plain step unless `speculate`: the reference the weighing must
    reach."""
    b = curves.shape[0]
    s0, sb, sv, s2, _ = cost.terms()
    best = -np.inf if speculate else _speed_of(cost, rows, curves, np.inf, 0)
    for depth in range(1, curves.shape[1] + 1):
        p = np.sort(curves[:, :depth].ravel())[::-1]
        whole = np.append(p[:-1] > p[1:], True)  # a threshold keeps every draft equal to it
        seconds = s0 + s2 * b * rows[depth] + sb * b + sv * np.arange(1, p.size + 1)
        best = max(best, float(np.max(((b + np.cumsum(p)) / np.maximum(seconds, 1e-9))[whole])))
    return best


def _with_rates(kmax: int, rates: np.ndarray) -> tuple[Acceptance, list[str]]:
    """Requests that accept at exactly these per-position rates (one try each, no prior)."""
    acceptance = Acceptance(kmax, decay=0.9, prior_weight=0.0)
    acceptance.prior = Counts([1.0] * kmax, [0.5] * kmax)
    ids = [f"r{i}" for i in range(len(rates))]
    for rid, row in zip(ids, rates):
        acceptance.requests[rid] = RequestStats(Counts([1.0] * kmax, row.tolist()))
    return acceptance, ids


def test_the_weighing_finds_the_best_depth_and_threshold_of_any_and_computes_few_drafts() -> None:
    """Random acceptance curves (ties, saturated and zero rows included) and cost fits (zero terms included): the
    drafts kept are as fast as the best depth and threshold of all (or a plain step), and few drafts are
    computed."""
    rng = np.random.default_rng(3)
    computed = total = 0
    for trial in range(400):
        kmax, b = int(rng.choice([4, 8, 32])), 1 if trial % 4 == 0 else int(rng.integers(2, 40))  # 1: its own loop
        rates = np.round(rng.uniform(0.0, 1.0, (b, kmax)) ** rng.uniform(0.05, 3), int(rng.integers(1, 4)))
        rates[rng.random(b) < 0.1] = 1.0
        acceptance, ids = _with_rates(kmax, rates)
        rows = [0] + [min(kmax, max(2 * d, 2)) for d in range(1, kmax + 1)]  # lookahead: twice K, at least 2
        present = rng.choice([0.0, 1.0], size=3, p=[0.15, 0.85])  # a term at 0 now and then
        s0, s1, s2 = present * np.array([1e-2, 3e-4, 2e-5]) * rng.uniform(0.2, 5, 3)
        dv = s1 * rng.uniform(-1.0, 0.5)  # a verified draft at 0-1.5x a request's token
        cost = CostModel(_s=[float(s0), float(s1), float(dv), float(s2)], _p0=float(rng.uniform(0.2, 1.5) * 1e-2))
        full = np.cumprod(rates, axis=1)
        for speculate in (True, False):
            curves = acceptance.curves(ids)
            threshold, depth = best_drafts(curves, cost.terms(), rows, speculate)
            assert (threshold == np.inf) == (depth == 0) and (threshold < np.inf or not speculate)
            chosen = _speed_of(cost, rows, full, threshold, depth)
            best = _best_speed_by_search(cost, rows, full, speculate)
            assert chosen == pytest.approx(best, rel=1e-9), (trial, speculate, threshold, depth)
            computed, total = computed + sum(map(len, curves.values)), total + b * kmax
    assert computed < 0.5 * total


def test_a_batch_of_four_or_more_keeps_its_weighing_for_a_few_steps_and_a_smaller_one_weighs_each_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While speculation measures faster, a batch of 4+ requests is weighed every `REWEIGH_EVERY` steps (in
    between its threshold and depth stand, each request's K following its own curve), one request swapped for
    another included; a batch of another size is weighed at once, and a batch of 2 at every step."""
    weighed = []
    weigh = optimiser.best_drafts

    def counted(*args, **kwargs) -> tuple[float, int]:
        weighed.append(ctrl.steps)
        return weigh(*args, **kwargs)

    monkeypatch.setattr(optimiser, "best_drafts", counted)
    for size, every in ((8, REWEIGH_EVERY), (2, 1)):
        ctrl = DepthController(DepthOptions(max_k=8, explore_every=10**6))
        ids = [f"r{i}" for i in range(size)]
        batch_steps(ctrl, ids, 60, plain_s=0.05 * size, spec_s=0.01 * size)  # speculation measured faster
        assert ctrl.speculating and ctrl.speculation_measured_faster(size)
        weighed.clear()
        drafted = batch_steps(ctrl, ids, 24, plain_s=0.05 * size, spec_s=0.01 * size)
        assert min(drafted) > 0
        assert np.diff(weighed).tolist() == [every] * (len(weighed) - 1) and len(weighed) == 24 // every
        if size >= REWEIGH_FROM:
            last = weighed[-1]
            weighed.clear()
            batch_steps(ctrl, ids[1:] + ["new"], REWEIGH_EVERY, plain_s=0.05 * size, spec_s=0.01 * size)
            assert weighed == [last + REWEIGH_EVERY]  # one request swapped for another: the same cadence
            weighed.clear()
            batch_steps(ctrl, ids[2:] + ["new"], 1, plain_s=0.05 * size, spec_s=0.01 * size)
            assert weighed == [ctrl.steps]  # a batch of another size: weighed at once


def test_alone_measured_factors_price_each_depth_and_the_best_depth_of_all_is_found() -> None:
    """A batch of one with factors on some token counts: the depth chosen is as fast as the best of every depth
    priced at its fit times its factor. Where the fit alone picks 1 draft, a step of 2 tokens measured dearer
    moves the choice to 2 drafts, and one of 6 tokens measured cheaper to 5, past where the fit alone stops."""
    rng = np.random.default_rng(5)
    for trial in range(300):
        kmax = int(rng.choice([4, 8, 16]))
        rates = np.round(rng.uniform(0.0, 1.0, (1, kmax)) ** rng.uniform(0.2, 3), 2)
        acceptance, ids = _with_rates(kmax, rates)
        rows = [0] + [min(kmax, max(2 * d, 2)) for d in range(1, kmax + 1)]
        s0, s1, s2 = np.array([1e-2, 3e-4, 2e-5]) * rng.uniform(0.2, 5, 3)
        cost = CostModel(_s=[float(s0), float(s1), 0.0, float(s2)], _p0=float(rng.uniform(0.2, 1.5) * 1e-2))
        factors = {int(t): float(rng.uniform(0.6, 1.4)) for t in rng.choice(range(1, kmax + 2), 3, replace=False)}
        s0, sb, sv, s2, plain = cost.terms()
        full = np.cumprod(rates[0])
        speeds = {d: (1 + full[:d].sum()) / ((s0 + sb + sv * d + s2 * rows[d]) * factors.get(1 + d, 1.0))
                  for d in range(1, kmax + 1)}
        for speculate in (True, False):
            threshold, depth = best_drafts(acceptance.curves(ids), cost.terms(), rows, speculate, factors)
            best = max(max(speeds.values()), -np.inf if speculate else 1 / (plain + sb))
            chosen = speeds[depth] if depth else 1 / (plain + sb)
            assert chosen == pytest.approx(best, rel=1e-9), (trial, speculate, depth, factors)
    acceptance, ids = _with_rates(8, np.array([[0.5, 0.1, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]]))
    terms, rows = CostModel(_s=[0.03, 0.003, 0.0, 0.0], _p0=0.03).terms(), [0] + [8] * 8
    assert best_drafts(acceptance.curves(ids), terms, rows, True)[1] == 1
    assert best_drafts(acceptance.curves(ids), terms, rows, True, {2: 1.3})[1] == 2
    assert best_drafts(acceptance.curves(ids), terms, rows, True, {6: 0.75})[1] == 5
