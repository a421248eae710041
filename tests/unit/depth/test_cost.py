"""The step-cost model (`peagle_vllm.depth.cost`): what the fit separates, and its lazily decayed sums."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from peagle_vllm.depth.acceptance import RESCALE
from peagle_vllm.depth.cost import CostModel
from peagle_vllm.depth.step import Step

RECORDED_STEPS = Path(__file__).parent.parent / "data" / "demo_engine_steps_c1.json"


def _seconds(model: CostModel, requests: int, verified: int, rows: int) -> float:
    """The model's price of a step (`CostModel.terms`); no draft rows: a plain step."""
    s0, sb, sv, s2, plain = model.terms()
    return (s0 + s2 * rows if rows else plain) + sb * requests + sv * verified


def test_cost_model_separates_requests_verified_drafts_draft_rows_and_the_draft_paths_overhead() -> None:
    model = CostModel()
    rng = np.random.default_rng(0)
    for _ in range(300):
        requests, rows = int(rng.integers(8, 100)), int(rng.choice([0, 8, 16, 64, 256]))
        verified = int(rng.integers(0, 3 * requests)) if rows else 0
        model.observe(requests, requests + verified, rows,
                      0.03 + 0.0004 * requests + 0.0001 * verified + 0.0001 * rows + 0.02 * (rows > 0))
    assert model.s == pytest.approx([0.05, 0.0004, 0.0001, 0.0001], rel=1e-3)
    assert model.p0 == pytest.approx(0.03, rel=1e-3)
    assert [_seconds(model, 100, 0, 0), _seconds(model, 100, 50, 64)] == pytest.approx([0.07, 0.1014], rel=1e-3)


def test_plain_steps_pin_the_per_token_cost_that_speculation_is_priced_with() -> None:
    """In fallback nearly every step is plain: their varying batch sizes fix the per-token cost, which
    then prices verification in a trial (a handful of speculative steps at one batch size and depth cannot
    tell a verified draft's cost from the draft path's: a draft is priced as a request's token)."""
    model = CostModel()
    rng = np.random.default_rng(0)
    for _ in range(200):
        tokens = int(rng.integers(1, 65))
        model.observe(tokens, tokens, 0, 0.003 + 0.0002 * tokens)
    for _ in range(4):
        model.observe(64, 128, 64, 0.008 + 0.0002 * 128 + 0.0001 * 64)
    assert model.s[1] == pytest.approx(0.0002, rel=0.02) and model.p0 == pytest.approx(0.003, rel=0.02)
    assert model.s[2] == pytest.approx(0.0002, rel=0.15)
    assert _seconds(model, 64, 64, 64) == pytest.approx(0.0402, rel=0.02)


def test_a_verified_draft_is_priced_apart_from_a_requests_token_when_the_data_tell_them_apart() -> None:
    """Plain steps at many batch sizes fix a request's token (0.6 ms: a whole request's work), speculative
    ones at varying depths a verified draft's (0.2 ms: one more position of a request already computed);
    one price for both overpriced verification (shallow drafts, and requests left at K=0 within a drafting
    step, where a GPU-like replay at c=16 ran 9% below K=1)."""
    model = CostModel()
    rng = np.random.default_rng(1)
    for _ in range(400):
        requests = int(rng.integers(4, 64))
        verified = int(rng.integers(1, 4)) * requests if rng.random() < 0.5 else 0
        rows = 8 * requests if verified else 0
        model.observe(requests, requests + verified, rows,
                      0.005 + 0.0006 * requests + 0.0002 * verified + 0.00001 * rows + 0.004 * (rows > 0))
    assert model.s[1:3] == pytest.approx([0.0006, 0.0002], rel=0.02)


def test_cost_fit_prices_a_recorded_batch_one_engine_as_measured() -> None:
    """1,000 steps of the demo engine at concurrency 1 under adaptive depth (Step fields, milliseconds):
    plain steps of 3-4 ms, speculative ones of 6-8 ms at K=1-4, a few deeper. At batch 1 the verified
    tokens and the draft rows rise together and every plain step has T = 1, so the data fix only sums
    of the costs; a fit that clipped its negative terms at 0 after solving priced a plain step at 8.7 ms
    and a draft row at 4.5 ms for hundreds of these steps (trials then drafted one token, a losing depth)."""
    model = CostModel()
    errors: list[float] = []
    for tokens, rows, ms, requests, emitted, verified in json.loads(RECORDED_STEPS.read_text()):
        step = Step(tokens, rows, ms / 1e3, requests, emitted, verified)
        if not (step.decode_only and emitted):
            continue
        if model.p0 is not None:  # each step priced before it is seen
            errors.append(abs(1e3 * _seconds(model, requests, verified, rows) - ms) / ms)
        model.observe(requests, tokens, rows, step.seconds)
    assert len(errors) > 900
    assert max(np.median(errors[k: k + 100]) for k in range(0, len(errors), 100)) < 0.15


def test_the_cost_fit_decays_its_sums_lazily() -> None:
    """CostModel's sums (kept x a growing scale, brought back past RESCALE) against decaying them each step."""
    rng = np.random.default_rng(6)
    model, xx, xy = CostModel(), np.zeros((5, 5)), np.zeros(5)
    for _ in range(8000):  # 0.98 ** -8000 passes RESCALE
        requests = int(rng.integers(1, 65))
        rows = int(rng.choice([0, requests * int(rng.integers(1, 9))]))
        tokens = requests + (int(rng.integers(0, 4 * requests)) if rows else 0)
        seconds = float(rng.uniform(1e-3, 5e-2))
        model.observe(requests, tokens, rows, seconds)
        x = np.array([float(rows > 0), float(rows == 0), tokens, tokens - requests, rows])
        xx, xy = 0.98 * xx + np.outer(x, x), 0.98 * xy + x * seconds
        assert model._scale <= RESCALE
    assert np.allclose(np.array(model._xx).reshape(5, 5) / model._scale, xx, rtol=1e-9)
    assert np.allclose(np.array(model._xy) / model._scale, xy, rtol=1e-9)


def test_the_fit_keeps_its_starting_values_until_three_steps_and_then_refits_every_few() -> None:
    """Before 3 observations the starting costs stand; after the first solve, 7 new steps that say otherwise change
    nothing, the 8th (`REFIT_EVERY`) does; until a plain step is seen, a plain step is priced as the draft path's."""
    model = CostModel()
    start = model.terms()
    assert start[4] == start[0] and model.p0 is None
    for _ in range(2):
        model.observe(4, 8, 16, 0.02)
    assert model.terms() == start
    model.observe(4, 8, 16, 0.02)
    fitted = model.terms()
    assert fitted != start
    for _ in range(7):
        model.observe(4, 4, 0, 0.005)
    assert model.terms() == fitted
    model.observe(4, 4, 0, 0.005)
    assert model.terms() != fitted and model.p0 is not None


def test_a_token_count_the_fit_misprices_gets_its_own_factor_from_recent_steps() -> None:
    """Drafting steps at batch 1 computing 2, 3 and 5 tokens, where 2 cost 25% more than a straight line through the
    others (as SmolLM2's output layer on this CPU): each count's factor is its measured over its fitted seconds, the
    dear count's above the others'; a count seen in fewer than `FACTOR_WEIGHT` recent steps has none, and one not
    seen for long loses its factor (the counts forget at the fit's rate)."""
    model = CostModel()
    rng = np.random.default_rng(2)
    for _ in range(300):
        tokens = int(rng.choice([2, 3, 5]))
        model.observe(1, tokens, 2 * (tokens - 1), (0.03 + 0.001 * tokens) * (1.25 if tokens == 2 else 1.0))
    model.observe(1, 9, 16, 0.04)
    factors = model.token_factors()
    assert sorted(factors) == [2, 3, 5]
    assert factors[2] > 1.1 * max(factors[3], factors[5])
    for tokens in (2, 3, 5):  # the factor times the fit is what such a step measured
        s0, sb, sv, s2, _ = model.terms()
        fitted = s0 + sb + sv * (tokens - 1) + s2 * 2 * (tokens - 1)
        assert fitted * factors[tokens] == pytest.approx((0.03 + 0.001 * tokens) * (1.25 if tokens == 2 else 1.0),
                                                          rel=1e-6)
    for _ in range(200):
        model.observe(1, 3, 4, 0.033)
    assert sorted(model.token_factors()) == [3]
