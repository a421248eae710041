"""Drafts from the head's logits (`peagle_vllm.proposer.sample_drafts`): greedy argmax, sampled drafts with the q
the verifier needs, mapped from the draft vocabulary to the target's."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from peagle_vllm.proposer import sample_drafts

VD, V = 5, 12  # draft and target vocabularies
DRAFT_TO_TARGET = torch.tensor([9, 2, 7, 0, 4])  # draft id -> target id


def _logits(b: int = 3, k: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, k, VD, generator=torch.Generator().manual_seed(seed)) * 2


def _pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value of these counts under these probabilities (renormalised in float64)."""
    probs = probs.double()
    expected = probs / probs.sum() * counts.sum().item()
    return float(chisquare(counts.double().numpy(), expected.numpy()).pvalue)


def test_greedy_drafts_are_the_argmax_mapped_to_target_ids_without_q() -> None:
    """temperature None (the host knows every request is greedy): no q. A tensor whose rows are all <= 0 is not
    read back to the host: the same argmax drafts, each with a one-hot q."""
    logits = _logits()
    greedy = DRAFT_TO_TARGET[logits.argmax(-1)]
    ids, q = sample_drafts(logits, DRAFT_TO_TARGET, None, target_vocab=V)
    assert q is None and torch.equal(ids, greedy)
    for temperature in (torch.zeros(3), torch.tensor([0.0, -1.0, 0.0])):
        ids, q = sample_drafts(logits, DRAFT_TO_TARGET, temperature, target_vocab=V)
        assert torch.equal(ids, greedy) and torch.equal(q, torch.nn.functional.one_hot(greedy, V).float())
    ids, q = sample_drafts(logits, None, None)
    assert q is None and torch.equal(ids, logits.argmax(-1)), "one vocabulary: draft ids are target ids"


def test_sampled_rows_carry_q_over_the_target_vocabulary_and_greedy_rows_a_one_hot_q() -> None:
    logits = _logits()
    temperature = torch.tensor([0.7, 0.0, 1.5])  # row 1 greedy within a sampled batch
    torch.manual_seed(0)
    ids, q = sample_drafts(logits, DRAFT_TO_TARGET, temperature, target_vocab=V)
    assert ids.shape == (3, 4) and q.shape == (3, 4, V)
    assert torch.allclose(q.sum(-1), torch.ones(3, 4))
    outside = torch.ones(V, dtype=torch.bool)
    outside[DRAFT_TO_TARGET] = False
    assert torch.all(q[:, :, outside] == 0), "no mass outside the draft vocabulary's ids"
    for row in (0, 2):
        assert torch.allclose(q[row][:, DRAFT_TO_TARGET], (logits[row] / temperature[row]).softmax(-1))
        assert torch.all(q[row].gather(-1, ids[row].unsqueeze(-1)) > 0), "a sampled id has mass in q"
    greedy = DRAFT_TO_TARGET[logits[1].argmax(-1)]
    assert torch.equal(ids[1], greedy)
    assert torch.equal(q[1], torch.nn.functional.one_hot(greedy, V).float())


def test_seeded_requests_draw_the_same_drafts_again_whatever_the_global_generator_does() -> None:
    logits, temperature = _logits(b=2, k=6), torch.tensor([1.0, 1.0])

    def draw(global_seed: int, seed: int) -> torch.Tensor:
        torch.manual_seed(global_seed)
        return sample_drafts(logits, DRAFT_TO_TARGET, temperature, {0: torch.Generator().manual_seed(seed)}, V)[0]

    first, again = draw(0, seed=42), draw(1, seed=42)
    assert torch.equal(first[0], again[0]), "row 0 is seeded: its drafts repeat"
    draws = {tuple(draw(0, seed=s)[0].tolist()) for s in range(20)}
    assert len(draws) > 1, "other seeds draw other drafts"


def test_sampled_drafts_follow_q() -> None:
    """4,000 rows of the same logits at temperature 0.8: the drafts' target ids are distributed as q says (a
    chi-square test that rejects the same counts against q at temperature 1)."""
    n = 4000
    logits = _logits(b=1, k=1).expand(n, 1, VD).contiguous()
    torch.manual_seed(1)
    ids, q = sample_drafts(logits, DRAFT_TO_TARGET, torch.full((n,), 0.8), target_vocab=V)
    counts = torch.bincount(ids.flatten(), minlength=V)
    assert counts.sum() == counts[DRAFT_TO_TARGET].sum() == n
    assert _pvalue(counts[DRAFT_TO_TARGET], q[0, 0, DRAFT_TO_TARGET]) > 1e-3
    assert _pvalue(counts[DRAFT_TO_TARGET], logits[0, 0].softmax(-1)) < 1e-6, "the test tells temperatures apart"


def test_a_target_vocabulary_defaults_to_the_draft_vocabulary() -> None:
    ids, q = sample_drafts(_logits(b=1, k=2), None, torch.tensor([1.0]))
    assert q.shape == (1, 2, VD) and torch.allclose(q.sum(-1), torch.ones(1, 2))
    assert 0 <= int(ids.min()) and int(ids.max()) < VD


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_each_draft_position_is_sampled_from_its_own_row(temperature: float) -> None:
    """K positions with different logits: each position's drafts follow its own q (positions are not mixed up)."""
    n, k = 3000, 3
    base = torch.tensor([[4.0, 0, 0, 0, 0], [0, 0, 4.0, 0, 0], [0, 0, 0, 0, 4.0]])
    torch.manual_seed(2)
    ids, q = sample_drafts(base.expand(n, k, VD).contiguous(), None, torch.full((n,), temperature))
    for j in range(k):
        counts = torch.bincount(ids[:, j], minlength=VD)
        assert _pvalue(counts, q[0, j]) > 1e-3
        assert int(counts.argmax()) == int(base[j].argmax())


@pytest.mark.parametrize("candidates", [None, 2])
def test_a_requests_top_k_and_top_p_cut_its_q_and_its_drafts_follow_it(candidates: int | None) -> None:
    """Row 0 with top-p 0.5, row 1 with top-k 2, row 2 with neither: q is the draft softmax cut as the target's
    distribution would be (`target_probs` over the draft vocabulary), and the drafts fall inside the cut."""
    n, k = 3, 2
    logits = _logits(b=n, k=k, seed=3)
    temperature, top_k, top_p = torch.ones(n), torch.tensor([VD, 2, VD]), torch.tensor([0.5, 1.0, 1.0])
    torch.manual_seed(0)
    ids, q = sample_drafts(logits, DRAFT_TO_TARGET, temperature, None, V, top_k, top_p, candidates)
    full = logits.softmax(-1)
    kept = (q[:, :, DRAFT_TO_TARGET] > 0)
    assert kept[2].all(), "no option: nothing cut"
    assert (kept[1].sum(-1) == 2).all() and torch.equal(kept[1], full[1] >= full[1].topk(2, -1).values[:, -1:])
    nucleus = kept[0]  # the fewest most likely draft tokens reaching half the mass
    assert (nucleus.sum(-1) < VD).all() and ((full[0] * nucleus).sum(-1) >= 0.5).all()
    assert torch.allclose(q[:, :, DRAFT_TO_TARGET][kept], (full / (full * kept).sum(-1, keepdim=True))[kept])
    for _ in range(50):
        ids, q = sample_drafts(logits, DRAFT_TO_TARGET, temperature, None, V, top_k, top_p, candidates)
        assert (q.gather(2, ids.unsqueeze(2)) > 0).all(), "every draft is inside its row's cut"


def test_with_candidates_a_row_too_flat_for_them_keeps_them_and_nothing_is_sorted(monkeypatch) -> None:
    """q need only resemble the cut distribution (verification corrects it): a flat row whose 2 candidates hold less
    than its top-p keeps those 2, where the target's distribution would be sorted whole."""
    from peagle_vllm import truncation

    monkeypatch.setattr(truncation, "by_sorting", lambda *a: pytest.fail("a draft row was sorted"))
    logits = torch.tensor([[[0.3, 0.2, 0.1, 0.0, -0.1]]])  # one request, one draft: 2 tokens hold ~45%
    _, q = sample_drafts(logits, DRAFT_TO_TARGET, torch.ones(1), None, V, None, torch.tensor([0.9]), candidates=2)
    assert sorted(torch.nonzero(q[0, 0]).squeeze(-1).tolist()) == sorted(DRAFT_TO_TARGET[:2].tolist())
