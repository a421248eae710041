"""Acceptance estimates (`peagle_vllm.depth.acceptance`): lazily decayed counts, the prior, the curves."""

from __future__ import annotations

import numpy as np
import pytest

from peagle_vllm.depth.acceptance import PRIOR_DECAY, RESCALE, Acceptance, Counts


def test_lazily_decayed_counts_equal_the_decayed_sums() -> None:
    """`Counts` (true counts x a growing scale, brought back past RESCALE) against decaying every position."""
    rng = np.random.default_rng(5)
    counts, tries, hits = Counts([0.0] * 8, [0.0] * 8), np.zeros(8), np.zeros(8)
    for _ in range(3000):  # 0.9 ** -3000 passes RESCALE many times over
        seen = int(rng.integers(1, 9))
        accepted = int(rng.integers(0, seen + 1))
        counts.add(seen, accepted, 0.9)
        tries, hits = 0.9 * tries, 0.9 * hits
        tries[:seen] += 1.0
        hits[:accepted] += 1.0
        assert counts.scale <= RESCALE
        assert np.allclose(np.array(counts.tries) / counts.scale, tries, rtol=1e-9)
        assert np.allclose(np.array(counts.hits) / counts.scale, hits, rtol=1e-9)


def test_a_verification_counts_the_rejected_draft_as_tried_and_skips_requests_without_drafts() -> None:
    """Drafts 1..accepted accepted, the next one tried and rejected, none beyond it seen; a request that verified no
    draft leaves no record."""
    acceptance = Acceptance(max_k=4, decay=0.5, prior_weight=2.0)
    acceptance.observe(["a", "b", "c"], [4, 0, 2], [1, 0, 2])
    assert set(acceptance.requests) == {"a", "c"}
    a, c = acceptance.requests["a"].counts, acceptance.requests["c"].counts
    assert (a.tries, a.hits, a.scale) == ([2.0, 2.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0], 2.0)  # scale 1 / decay
    assert c.tries == [2.0, 2.0, 0.0, 0.0] and c.hits == [2.0, 2.0, 0.0, 0.0]  # all of its 2 drafts accepted
    prior = acceptance.prior  # both, one after the other, at the prior's own decay
    assert prior.scale == pytest.approx(PRIOR_DECAY ** -2)
    assert prior.tries == pytest.approx([PRIOR_DECAY ** -1 + PRIOR_DECAY ** -2] * 2 + [0.0, 0.0])


def test_curves_shrink_each_requests_rates_towards_the_prior() -> None:
    """P_r(i) is the product of request r's conditional rates (hits + w x prior) / (tries + w), w pseudo-observations
    of the prior; a request not seen yet follows the prior alone, and a prior position never tried takes the rate of
    the one before it (so that K can grow into it)."""
    acceptance = Acceptance(max_k=3, decay=0.9, prior_weight=2.0)
    acceptance.prior = Counts(tries=[4.0, 2.0, 0.0], hits=[3.0, 1.0, 0.0])
    acceptance.stats("seen").counts = Counts(tries=[2.0, 2.0, 1.0], hits=[2.0, 1.0, 0.0])
    prior = [(3.0 + 2 * 0.5) / (4 + 2)]  # each prior position shrunk towards the one before (0.5 before the first)
    prior.append((1.0 + 2 * prior[0]) / (2 + 2))
    prior.append(prior[1])  # never tried
    curves = acceptance.curves(["new", "seen"])
    assert curves.prefix(0, 3) == pytest.approx(np.cumprod(prior))
    own = [(h + 2 * p) / (t + 2) for h, t, p in zip([2.0, 1.0, 0.0], [2.0, 2.0, 1.0], prior)]
    assert curves.prefix(1, 3) == pytest.approx(np.cumprod(own))
    assert curves.reaching(1, own[0] * own[1], 3) == 2 and curves.reaching(1, 1.1, 3) == 0


def test_a_request_in_a_batch_is_shrunk_towards_the_prior_by_the_batch_weight() -> None:
    """The same counts weigh the prior `prior_weight` pseudo-observations for a request alone and
    `batch_prior_weight` for one among others: three rejections in a row pull a request alone to 0.2 a draft, one in
    a batch to 0.36, where the prior stands at 0.5."""
    acceptance = Acceptance(max_k=2, decay=0.9, prior_weight=2.0, batch_prior_weight=8.0)
    acceptance.prior = Counts(tries=[10.0, 0.0], hits=[5.0, 0.0])
    acceptance.stats("a").counts = Counts(tries=[3.0, 0.0], hits=[0.0, 0.0])
    alone = acceptance.curves(["a"]).prefix(0, 1)[0]
    together = acceptance.curves(["a", "b"]).prefix(0, 1)[0]
    assert alone == pytest.approx(2 * 0.5 / (3 + 2)) and together == pytest.approx(8 * 0.5 / (3 + 8))
    assert Acceptance(max_k=2, decay=0.9, prior_weight=2.0).batch_prior_weight == 2.0, "the same unless given"


def test_forgetting_a_request_drops_its_record() -> None:
    acceptance = Acceptance(max_k=2, decay=0.9, prior_weight=2.0)
    acceptance.observe(["a"], [2], [2])
    acceptance.forget("a")
    acceptance.forget("never seen")
    assert acceptance.requests == {} and acceptance.prior.hits[0] > 0
