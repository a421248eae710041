"""The block sampler on tensors: exact greedy behaviour, and losslessness in distribution for
token-wise and block verification (chi-square over >= 100k simulated generations)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from peagle_vllm.verify import (PLACEHOLDER, sample_rows, target_probs, verify, verify_block, verify_greedy,
                                verify_standard)

V, K, N = 4, 3, 3  # vocabulary, drafts per step, tokens generated per trial
TRIALS = 100_000


class ToyModels:
    """Context-dependent target/draft distributions over a tiny vocabulary, indexed by prefix code."""

    def __init__(self, seed: int, temperature: float, top_k: int, top_p: float, min_p: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        max_len = N + K + 1
        self.offset = [sum(V**i for i in range(l)) for l in range(max_len + 1)]
        n_codes = self.offset[-1]
        logits = torch.randn(n_codes, V, generator=g) * 1.5
        ones = torch.ones(n_codes)
        self.p = target_probs(logits, ones * temperature, torch.full((n_codes,), top_k),
                              ones * top_p, ones * min_p)
        self.q = (torch.randn(n_codes, V, generator=g) * 1.5).softmax(-1)

    def child(self, code: torch.Tensor, length: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        off = torch.tensor(self.offset)
        return off[length + 1] + (code - off[length]) * V + tok


def simulate(models: ToyModels, sampler, seed: int, trials: int = TRIALS) -> tuple[torch.Tensor, float]:
    """Generates N tokens per trial by repeated draft/verify steps; returns sequence cells, mean accepted."""
    torch.manual_seed(seed)
    seq = torch.full((trials, N + K + 1), -1, dtype=torch.long)
    length = torch.zeros(trials, dtype=torch.long)
    code = torch.zeros(trials, dtype=torch.long)
    accepted_total, steps = 0.0, 0
    while bool((length < N).any()):
        active = (length < N).nonzero().squeeze(1)
        c, l = code[active], length[active]
        drafts, qs, ps, codes = [], [], [], [c]
        for _ in range(K):
            q = models.q[codes[-1]]
            x = torch.multinomial(q, 1).squeeze(1)
            drafts.append(x), qs.append(q), ps.append(models.p[codes[-1]])
            codes.append(models.child(codes[-1], l + len(drafts) - 1, x))
        bonus = torch.multinomial(models.p[codes[-1]], 1).squeeze(1)
        d = torch.stack(drafts, 1)
        num = torch.full((len(active),), K)
        res = sampler(d, num, torch.stack(qs, 1), torch.stack(ps, 1), bonus)
        accepted_total += res.num_accepted.float().sum().item()
        steps += len(active)
        for j in range(K + 1):
            tok = res.tokens[:, j]
            ok = (tok != PLACEHOLDER) & (length[active] < N)
            idx = active[ok]
            seq[idx, length[idx]] = tok[ok]
            code[idx] = models.child(code[idx], length[idx], tok[ok])
            length[idx] += 1
    cells = (seq[:, :N] * torch.tensor([V ** (N - 1 - i) for i in range(N)])).sum(1)
    return cells, accepted_total / steps


def expected_cells(models: ToyModels) -> torch.Tensor:
    probs = torch.zeros(V**N)
    for cell in range(V**N):
        toks = [(cell // V ** (N - 1 - i)) % V for i in range(N)]
        code, prob = torch.tensor([0]), 1.0
        for i, t in enumerate(toks):
            prob *= models.p[code].squeeze(0)[t].item()
            code = models.child(code, torch.tensor([i]), torch.tensor([t]))
        probs[cell] = prob
    return probs


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0),
                                                           (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.2)])
@pytest.mark.parametrize("name", ["standard", "block"])
def test_lossless_in_distribution(name: str, temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    models = ToyModels(seed=3, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    sampler = verify_standard if name == "standard" else verify_block
    cells, _ = simulate(models, sampler, seed=11)
    assert_matches_target(cells, models, f"{name} verification")


def assert_matches_target(cells: torch.Tensor, models: ToyModels, what: str) -> None:
    expected = expected_cells(models).double()
    observed = torch.bincount(cells, minlength=V**N).double()
    support = expected > 0
    assert observed[~support].sum() == 0, f"{what} emitted a sequence the target can never produce"
    exp = expected[support] / expected[support].sum() * observed.sum()
    stat = chisquare(observed[support].numpy(), exp.numpy())
    assert stat.pvalue > 0.001, f"{what} is not lossless: p={stat.pvalue:.2e}"


def test_block_accepts_at_least_tokenwise() -> None:
    models = ToyModels(seed=5, temperature=1.0, top_k=0, top_p=1.0)
    _, standard = simulate(models, verify_standard, seed=1, trials=40_000)
    _, block = simulate(models, verify_block, seed=1, trials=40_000)
    print(f"mean accepted drafts per step: token-wise {standard:.3f}, block {block:.3f}")
    assert block >= standard - 0.01


def test_one_hot_drafts_are_lossless() -> None:
    """draft_probs None (deterministic drafts) is treated as one-hot q."""
    models = ToyModels(seed=7, temperature=1.0, top_k=0, top_p=1.0)
    models.q = torch.nn.functional.one_hot(models.q.argmax(-1), V).float()

    def one_hot(d, n, q, p, b):
        return verify_standard(d, n, None, p, b)

    cells, _ = simulate(models, one_hot, seed=2)
    assert_matches_target(cells, models, "one-hot drafts")


def test_greedy_takes_longest_matching_prefix_then_target_token() -> None:
    drafts = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 0, 0]])
    argmax = torch.tensor([[5, 6, 7, 8], [5, 0, 7, 8], [0, 2, 3, 4], [9, 9, 9, 9]])
    num = torch.tensor([4, 4, 4, 2])  # last row: only 2 real drafts, padding never accepted
    bonus = torch.tensor([42, 42, 42, 43])
    res = verify_greedy(drafts, num, argmax, bonus)
    assert res.tokens.tolist() == [[5, 6, 7, 8, 42], [5, 0, -1, -1, -1], [0, -1, -1, -1, -1], [9, 9, 43, -1, -1]]
    assert res.num_accepted.tolist() == [4, 1, 0, 2]
    assert res.accepted[1].tolist() == [True, False, False, False]


def test_mixed_batch_keeps_greedy_rows_exact() -> None:
    torch.manual_seed(0)
    b, k, v = 6, 5, 11
    logits = torch.randn(b, k, v)
    argmax = logits.argmax(-1)
    drafts = argmax.clone()
    drafts[:, 2] = (argmax[:, 2] + 1) % v
    is_greedy = torch.tensor([True, False, True, False, True, False])
    probs = target_probs(logits.view(-1, v), torch.ones(b * k)).view(b, k, v)
    res = verify("block", drafts, torch.full((b,), k), None, probs, argmax, torch.zeros(b, dtype=torch.long), is_greedy)
    for row in (0, 2, 4):
        assert res.tokens[row, :3].tolist() == [argmax[row, 0], argmax[row, 1], argmax[row, 2]]
        assert res.num_accepted[row] == 2


def test_a_batch_without_greedy_rows_needs_no_target_argmax() -> None:
    torch.manual_seed(0)
    b, k, v = 6, 5, 11
    logits = torch.randn(b, k, v)
    drafts, num, bonus = logits.argmax(-1), torch.full((b,), k), torch.zeros(b, dtype=torch.long)
    probs = target_probs(logits.view(-1, v), torch.ones(b * k)).view(b, k, v)
    sampled = torch.zeros(b, dtype=torch.bool)
    torch.manual_seed(1)
    with_argmax = verify("block", drafts, num, None, probs, drafts, bonus, sampled)
    torch.manual_seed(1)
    without = verify("block", drafts, num, None, probs, None, bonus, sampled)
    assert torch.equal(without.tokens, with_argmax.tokens) and torch.equal(without.accepted, with_argmax.accepted)
    assert 0 < int(without.num_accepted.sum()) < b * k, "some drafts accepted, some not"


def test_top_k_top_p_min_p_match_definitions() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    one = torch.ones(1)
    assert (target_probs(logits, one, top_k=torch.tensor([2]))[0, 2:] == 0).all()
    p = target_probs(logits, one, top_p=torch.tensor([0.7]))  # softmax: .64 .24 .09 ...
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    p = target_probs(logits, one, min_p=torch.tensor([0.3]))  # keeps probs >= .3 * .64
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    assert torch.allclose(target_probs(logits, torch.tensor([0.5]))[0], (logits[0] * 2).softmax(-1))


@pytest.mark.parametrize("sampler", [verify_standard, verify_block])
def test_padded_rows_with_fewer_drafts_never_accept_padding(sampler) -> None:
    """Adaptive depth verifies fewer drafts for some requests: their padding (-1) is never accepted."""
    torch.manual_seed(0)
    b, k, v = 4, 6, 9
    probs = torch.full((b, k, v), 1.0 / v)
    drafts = torch.randint(0, v, (b, k))
    num = torch.tensor([6, 3, 1, 0])
    drafts[torch.arange(k) >= num.unsqueeze(1)] = -1
    q = torch.full((b, k, v), 1.0 / v)  # q == p: every real draft is accepted
    res = sampler(drafts, num, q, probs, torch.tensor([7, 7, 7, 7]))
    assert res.num_accepted.tolist() == [6, 3, 1, 0]
    assert res.tokens[1, :4].tolist() == drafts[1, :3].tolist() + [7] and res.tokens[3, 0] == 7


def test_top_p_of_one_leaves_a_row_untouched_whatever_the_other_rows_ask() -> None:
    """top_p 1 is off per row: in a batch where another row uses top-p, the row's distribution is the plain
    softmax (float32 cumulative mass may round past 1 before the tail; that must not cut the tail)."""
    one, top_p = torch.ones(2), torch.tensor([0.5, 1.0])
    for seed in range(10):
        logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(seed)) * 3
        p = target_probs(logits, one, top_p=top_p)
        assert torch.equal(p[1], logits[1].softmax(-1))
        assert (p[0] == 0).any(), "the other row is cut"


def test_sample_rows_draws_each_row_in_proportion_to_its_weights() -> None:
    torch.manual_seed(7)
    weights = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.5],
                            [2.0, 0.0, 0.0, 0.0, 0.0],
                            [1e-3, 0.0, 0.0, 0.0, 4e-3],
                            [0.0, 0.0, 0.0, 0.0, 7.0]])
    seeded = torch.Generator().manual_seed(3)  # row 2 races its own generator's noise, the others do not
    draws = torch.stack([sample_rows(weights, {2: seeded}) for _ in range(40_000)])  # [trials, 4]
    for row, w in enumerate(weights):
        observed = torch.bincount(draws[:, row], minlength=5).double()
        support = w > 0
        assert observed[~support].sum() == 0, f"row {row} drew a token of weight zero"
        if int(support.sum()) > 1:
            expected = w[support].double() / w[support].double().sum() * observed.sum()
            assert chisquare(observed[support].numpy(), expected.numpy()).pvalue > 0.001


def test_sample_rows_seeded_rows_repeat_whatever_the_other_rows() -> None:
    weights = torch.rand(3, 1000)
    first = sample_rows(weights, {1: torch.Generator().manual_seed(5)})
    other = weights.clone()
    other[0] = torch.rand(1000)
    again = sample_rows(other, {1: torch.Generator().manual_seed(5)})
    assert first[1] == again[1]
    assert sample_rows(torch.zeros(0, 8)).shape == (0,)
