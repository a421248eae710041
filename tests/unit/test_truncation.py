"""top-k / top-p from each row's most likely tokens (`truncation.by_candidates`) remove exactly what sorting the
whole row removes (`truncation.by_sorting`), on rows the candidates decide and rows they leave to the sort."""

from __future__ import annotations

import pytest
import torch
from peagle_vllm import truncation
from peagle_vllm.verify import target_probs

V = 2000


def _rows(n: int, seed: int) -> torch.Tensor:
    """Peaked rows (the candidates decide them) and flat ones (they do not), with a -inf tail (min-p) in some."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([8.0, 0.3, 3.0, 1.0] * n)[:n].unsqueeze(1)
    logits = torch.randn(n, V, generator=g) * scale
    logits[1::3, V // 2:] = float("-inf")
    return logits


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("options", ["top_p", "top_k", "both"])
def test_candidates_remove_what_sorting_removes(seed: int, options: str) -> None:
    n = 12
    logits = _rows(n, seed)
    top_p = torch.tensor([0.5, 0.9, 0.99, 1.0, 0.95, 0.3] * 2) if options != "top_k" else None
    top_k = torch.tensor([0, 5, 40, 300, V, 64, 1, 1000, -1, 20, 200, 63]) if options != "top_p" else None
    expected = truncation.by_sorting(logits, top_k, top_p)
    got = truncation.by_candidates(logits, top_k, top_p, candidates=64)
    assert torch.equal(got, expected)
    kept = (~expected).sum(-1)
    assert (kept > 64).any() and (kept <= 64).any(), "both kinds of row are exercised"


def test_a_top_k_beyond_the_candidates_renormalises_top_p_over_tokens_they_do_not_hold() -> None:
    """top-k 1000 keeps 73% of the mass; top-p 0.4 then cuts within the 64 candidates by full-vocabulary mass, but
    not where top-p over the top-k tokens cuts: such a row is sorted whole."""
    logits = torch.zeros(1, V)
    logits[0, :64] = torch.linspace(6, 5, 64)
    logits[0, 64:1000] = torch.linspace(2.5, 2, 936)
    logits[0, 1000:] = torch.linspace(2.5, 2, V - 1000) - 0.01
    top_k, top_p = torch.tensor([1000]), torch.tensor([0.4])
    expected = truncation.by_sorting(logits, top_k, top_p)
    assert torch.equal(truncation.by_candidates(logits, top_k, top_p, candidates=64), expected)
    assert not torch.equal(expected, truncation.by_sorting(logits, None, top_p)), "top-k changes the top-p cut"


def test_rows_the_candidates_leave_undecided_try_eight_times_as_many_before_a_sort(monkeypatch) -> None:
    """Row 0's top-p mass lies within its 64 most likely tokens, row 1's within 512 (decided by the wider tier, not
    sorted), row 2's beyond them (sorted): the mask is sorting's for all three."""
    logits = torch.zeros(3, V)
    logits[0, :10] = torch.linspace(8.0, 7.9, 10)
    logits[1, :300] = torch.linspace(6.0, 5.9, 300)
    logits[2] = torch.linspace(0.01, 0.0, V)
    top_p = torch.full((3,), 0.9)
    sorted_rows = []
    by_sorting = truncation.by_sorting
    monkeypatch.setattr(truncation, "by_sorting", lambda x, *a: sorted_rows.append(x.shape[0]) or by_sorting(x, *a))
    got = truncation.by_candidates(logits, None, top_p, candidates=64)
    assert sorted_rows == [1]
    assert torch.equal(got, by_sorting(logits, None, top_p))
    kept = (~got).sum(-1).tolist()
    assert kept[0] <= 64 < kept[1] <= 512 < kept[2]


def test_within_the_candidates_a_row_they_decide_is_cut_as_sorting_cuts_it_and_another_keeps_them() -> None:
    """A draft's q need only resemble the cut distribution: rows whose top-p mass lies within the 64 candidates get
    sorting's mask, a flatter row keeps its 64 candidates and nothing else (sorting would keep more)."""
    logits = torch.zeros(3, V)
    logits[0, :10] = torch.linspace(8.0, 7.9, 10)
    logits[1, :300] = torch.linspace(6.0, 5.9, 300)
    logits[2, :40] = torch.linspace(9.0, 8.0, 40)
    top_p, top_k = torch.full((3,), 0.9), torch.tensor([0, 0, 20])
    got = truncation.within_candidates(logits, top_k, top_p, candidates=64)
    exact = truncation.by_sorting(logits, top_k, top_p)
    assert torch.equal(got[[0, 2]], exact[[0, 2]])
    assert torch.equal(~got[1], logits[1] >= logits[1, 63]) and (~exact[1]).sum() > 64


def test_target_probs_is_the_same_either_way() -> None:
    logits = _rows(8, 7)
    temperature, top_p = torch.full((8,), 0.8), torch.full((8,), 0.9)
    assert torch.equal(target_probs(logits, temperature, top_p=top_p),
                       target_probs(logits, temperature, top_p=top_p, candidates=32))


@pytest.mark.parametrize("logprobs_mode", ["raw_logprobs", "processed_logits"])
def test_the_cpu_bonus_sampler_draws_what_vllms_sampler_draws_from_the_same_seeds(logprobs_mode: str) -> None:
    """`bonus_sampler.with_candidate_top_p` against vLLM's Sampler on the same logits and seeded generators:
    the same tokens (the same mask, then vLLM's own draw), and the same processed logits."""
    pytest.importorskip("vllm")
    import vllm._custom_ops  # noqa: F401  (the CPU sampler's kernels)
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    from peagle_vllm.vllm_adapter.v1.bonus_sampler import with_candidate_top_p

    n = 12
    logits = _rows(n, 3)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * 3)

    def metadata(seed: int) -> SamplingMetadata:
        return SamplingMetadata(
            temperature=temperature, all_greedy=False, all_random=False,
            top_p=torch.tensor([0.5, 0.9, 0.99, 1.0, 0.95, 0.3] * 2),
            top_k=torch.tensor([V, 5, 40, 300, V, 64, 1, 1000, V, 20, 200, 63]),  # off: V, as vLLM passes it
            generators={i: torch.Generator().manual_seed(seed * 100 + i) for i in range(n)},
            max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(n),
            presence_penalties=torch.zeros(n), repetition_penalties=torch.ones(n), output_token_ids=[[]] * n,
            allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())

    vllms = Sampler(logprobs_mode=logprobs_mode)
    ours = with_candidate_top_p(vllms, candidates=64)
    drawn = set()
    for seed in range(20):
        expected = vllms.sample(logits.clone(), metadata(seed))
        got = ours.sample(logits.clone(), metadata(seed))
        assert torch.equal(got[0], expected[0])
        if logprobs_mode == "processed_logits":
            assert torch.equal(got[1], expected[1])
        drawn.update(got[0][1:].tolist())
    assert len(drawn) > 20, "the draws vary with the seed"


def test_the_cpu_bonus_sampler_draws_unseeded_rows_among_their_candidates_from_the_cut_distribution() -> None:
    """Unseeded rows whose candidates hold every kept token never reach vLLM's draw over the whole vocabulary, and
    their tokens follow the cut distribution (chi-square, 8,000 draws of one row keeping 21 tokens); a flat row (the
    candidates do not hold it) and a seeded one go to vLLM's draw, alone, the seeded one drawing what vLLM's sampler
    draws."""
    pytest.importorskip("vllm")
    from scipy.stats import chisquare
    import vllm._custom_ops  # noqa: F401  (the CPU sampler's kernels)
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from peagle_vllm.vllm_adapter.v1.bonus_sampler import CandidateTopKTopP

    reached = []

    class Spy(TopKTopPSampler):
        def forward_cpu(self, logits, generators, k, p):
            reached.append((logits.shape[0], dict(generators)))
            return super().forward_cpu(logits, generators, k, p)

    inner = Spy()
    inner.forward = inner.forward_cpu
    ours = CandidateTopKTopP(inner, candidates=64)
    peaked = torch.randn(1, V, generator=torch.Generator().manual_seed(5))
    peaked[0, :30] += 7  # top-p 0.9 keeps 21 tokens, all among the 64 candidates
    flat = _rows(2, 5)[1:]
    n = 8000
    top_p = torch.full((n,), 0.9)
    tokens, cut = ours(peaked.expand(n, -1).clone(), {}, None, top_p)
    assert cut is None and reached == [], "no row reached vLLM's draw"
    probs = peaked.masked_fill(truncation.by_sorting(peaked, None, top_p[:1]), float("-inf")).softmax(-1)[0]
    observed = torch.bincount(tokens, minlength=V).double()
    support = probs > 0
    assert observed[~support].sum() == 0 and support.sum() == 21, "only kept tokens"
    expected = probs[support].double() / probs[support].double().sum() * n
    assert chisquare(observed[support].numpy(), expected.numpy()).pvalue > 0.001

    seed = torch.Generator().manual_seed(7)
    rows = torch.cat([peaked, flat, peaked, peaked])
    tokens, _ = ours(rows.clone(), {2: seed}, None, torch.full((4,), 0.9))
    assert [(size, list(gens)) for size, gens in reached] == [(2, [1])], "the flat row and the seeded one, alone"
    expected_seeded = Spy().forward_cpu(rows[2:3].masked_fill(truncation.by_sorting(rows[2:3], None, top_p[:1]),
                                                              float("-inf")), {0: torch.Generator().manual_seed(7)},
                                        None, None)[0]
    assert tokens[2] == expected_seeded[0]
    assert not truncation.by_sorting(rows, None, torch.full((4,), 0.9))[torch.arange(4), tokens].any()


def test_truncation_is_on_where_top_p_is_below_one_or_top_k_within_the_vocabulary() -> None:
    top_p, top_k = torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0]), torch.tensor([V, V, 5, 0, -1])
    assert truncation.truncation_on(top_k, top_p, V).tolist() == [False, True, True, False, False]
    assert truncation.truncation_on(None, top_p, V).tolist() == [False, True, False, False, False]
    assert truncation.truncation_on(top_k, None, V).tolist() == [False, False, True, False, False]
    assert truncation.truncation_on(None, None, V) is None
