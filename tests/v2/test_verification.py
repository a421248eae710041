"""Verification on vLLM 0.34 is vLLM's own rejection sampler (Triton kernels: GPU only), fed by the speculator:
drafts drawn from q = softmax(rounded logits / T) and those logits left in vLLM's DraftLogitsCache, from which the
sampler rebuilds q. Checked here on CPU: the cache holds the very numbers the drafts were drawn from, sampled
drafts follow the q rebuilt from the cache (chi-square) and greedy ones are its argmax, and drafts made this way,
verified by the same tests V2 runs (the core's `verify_standard` / `verify_block`: min(1, p/q) and Sun et al.'s
block rule), emit tokens distributed as the target's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


def _rebuilt_q(values: torch.Tensor, slots: torch.Tensor, k: int, temperature: torch.Tensor) -> torch.Tensor:
    """What vLLM 0.34's rejection kernel computes from the cache values [max_reqs, K_max, V] for requests at
    slots [B] with temperature [B] (> 0): softmax(float32 cached logits / T) per depth -> [B, k, V]."""
    return (values[slots, :k].float() / temperature.float().view(-1, 1, 1)).softmax(-1)


def _cache(num_slots: int, k: int, v: int, dtype: torch.dtype):
    from vllm.v1.worker.gpu.spec_decode.draft_logits import DraftLogitsCache

    return DraftLogitsCache(num_slots, k, v, dtype=dtype, fill=0.0, device="cpu")


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_the_cache_holds_what_the_drafts_were_drawn_from(cache_dtype) -> None:
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block, draft_probs

    torch.manual_seed(0)
    b, k, vd, v = 3, 4, 40, 100
    d2t = torch.arange(0, 2 * vd, 2)  # draft id i is target id 2i
    logits = torch.randn(b, k, vd) * 3
    temperature = torch.tensor([0.0, 0.7, 1.3])
    cache = _cache(8, k, v, cache_dtype)
    idx_mapping = torch.tensor([5, 2, 7])
    tokens, rounded, num_bad = draft_block(logits, d2t, temperature, cache_dtype)
    cache_draft_logits(cache.values, idx_mapping, rounded, d2t)
    assert rounded.dtype == cache_dtype and int(num_bad) == 0
    assert bool((tokens % 2 == 0).all()) and tokens.max() < 2 * vd  # drafts are target ids of the draft vocabulary
    assert torch.equal(tokens[0], d2t[rounded[0].float().argmax(-1)])  # greedy request: argmax
    cached = cache.values[idx_mapping, :k]
    assert torch.equal(cached[..., d2t], rounded)  # the very numbers the drafts were drawn from
    outside = torch.ones(v, dtype=torch.bool)
    outside[d2t] = False
    assert bool((cached[..., outside] == float("-inf")).all())
    # so the rebuilt q is the drafts' q up to float32 summation order (the -inf entries add exact zeros)
    rebuilt = _rebuilt_q(cache.values, idx_mapping[1:], k, temperature[1:])
    torch.testing.assert_close(rebuilt[..., d2t], draft_probs(rounded, temperature)[1:], rtol=0, atol=1e-6)
    assert bool((rebuilt[..., outside] == 0).all())
    assert bool((cache.values[0] == 0).all())  # other request slots untouched


def _chi_square_p(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of samples [n] (ids) against probs [V]; bins expecting fewer than 5 draws are
    merged into one. The chi-square tail is torch's regularized upper incomplete gamma (this environment has no
    scipy): P(X > x) = gammaincc(df / 2, x / 2)."""
    n = samples.shape[0]
    observed = torch.bincount(samples, minlength=probs.shape[0]).double()
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    stat = ((obs - exp) ** 2 / exp.clamp_min(1e-12)).sum()
    df = (exp > 0).sum().double() - 1  # the bins that can hold a draw, minus 1
    return float(torch.special.gammaincc(df / 2, stat / 2))


def test_sampled_drafts_follow_the_q_rebuilt_from_the_cache() -> None:
    """A mixed batch: every even request greedy, every odd one sampled at T; one draft row set shared by all."""
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(2)
    m, k, vd, v, temp = 20000, 3, 16, 40, 0.8
    d2t = torch.randperm(v)[:vd]
    logits = (torch.randn(1, k, vd) * 1.5).expand(2 * m, -1, -1)
    temperature = torch.tensor([0.0, temp]).repeat(m)
    cache = _cache(2 * m, k, v, torch.bfloat16)
    tokens, rounded, _ = draft_block(logits, d2t, temperature, torch.bfloat16)
    cache_draft_logits(cache.values, torch.arange(2 * m), rounded, d2t)
    greedy, sampled = tokens[0::2], tokens[1::2]
    assert bool((greedy == d2t[rounded[0].float().argmax(-1)]).all())
    q = _rebuilt_q(cache.values, torch.tensor([1]), k, torch.tensor([temp]))[0]  # [k, V], as the verifier sees it
    hotter = _rebuilt_q(cache.values, torch.tensor([1]), k, torch.tensor([1.5 * temp]))[0]
    for depth in range(k):
        assert _chi_square_p(sampled[:, depth], q[depth]) > 1e-3
        assert _chi_square_p(sampled[:, depth], hotter[depth]) < 1e-6  # the check tells a wrong q apart


@pytest.mark.parametrize("mode", ["standard", "block"])
def test_drafts_and_cache_verify_losslessly(mode) -> None:
    from peagle_vllm.verify import verify_block, verify_standard
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(1)
    n, k, v, temp = 40000, 3, 6, 0.9
    draft_logits = torch.randn(1, k, v).expand(n, -1, -1)
    target = torch.randn(k + 1, v)  # position-wise target logits (a target whose next token ignores the past)
    p = (target / temp).softmax(-1)
    tokens, rounded, _ = draft_block(draft_logits, None, torch.full((n,), temp), torch.float32)
    values = torch.zeros(n, k, v)
    cache_draft_logits(values, torch.arange(n), rounded, None)
    q = _rebuilt_q(values, torch.arange(n), k, torch.full((n,), temp))
    bonus = torch.multinomial(p[k], n, replacement=True)
    verifier = verify_block if mode == "block" else verify_standard
    out = verifier(tokens, torch.full((n,), k), q, p[:k].expand(n, -1, -1), bonus)
    first = torch.bincount(out.tokens[:, 0], minlength=v).float() / n
    assert (first - p[0]).abs().max() < 0.015, (first, p[0])
    assert 0 < float(out.num_accepted.float().mean()) < k


def test_sampled_drafts_follow_the_requests_top_k_and_top_p_and_the_cache_says_so() -> None:
    """Requests with top-k 3, with top-p 0.6, and with neither, all at T: each one's drafts follow q cut as vLLM cuts
    the target (temperature, then top-k, then top-p), the cache rebuilds that very q (zero where cut), and a greedy
    request with top-k set still drafts the argmax."""
    from peagle_vllm.truncation import by_sorting
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(3)
    m, k, vd, temp = 12000, 2, 12, 0.9
    logits = (torch.randn(1, k, vd) * 1.5).expand(4 * m, -1, -1)
    temperature = torch.tensor([temp, temp, temp, 0.0]).repeat(m)
    top_k = torch.tensor([3, vd, vd, 3]).repeat(m)
    top_p = torch.tensor([1.0, 0.6, 1.0, 1.0]).repeat(m)
    tokens, rounded, _ = draft_block(logits, None, temperature, torch.float32, top_k, top_p)
    values = torch.zeros(4 * m, k, vd)
    cache_draft_logits(values, torch.arange(4 * m), rounded, None)
    for r, (kk, pp) in enumerate([(3, 1.0), (vd, 0.6), (vd, 1.0)]):
        q = _rebuilt_q(values, torch.tensor([r]), k, torch.tensor([temp]))[0]  # [k, Vd], as the verifier sees it
        cut = by_sorting(logits[0].float() / temp, torch.full((k,), kk), torch.full((k,), pp))
        expected = (logits[0].float() / temp).masked_fill(cut, float("-inf")).softmax(-1)
        torch.testing.assert_close(q, expected, rtol=0, atol=1e-6)
        assert bool((q[cut] == 0).all()) and bool(cut.any()) == (r != 2)  # the first two requests do cut
        for depth in range(k):
            assert _chi_square_p(tokens[r::4, depth], q[depth]) > 1e-3
    assert bool((tokens[3::4] == rounded[3].argmax(-1)).all())  # greedy: the argmax, top-k or not


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocabulary", ["draft", "target"])
def test_a_looked_up_drafts_cached_row_is_one_hot(cache_dtype, vocabulary) -> None:
    """Rows a lookup drafted hold 0 at the drafted token and -inf elsewhere, so the verifier rebuilds q as that
    point mass at any temperature; the head's rows keep the logits their drafts were drawn from."""
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(4)
    b, k, vd, v = 3, 4, 40, 100
    d2t = torch.arange(0, 2 * vd, 2) if vocabulary == "draft" else None
    temperature = torch.tensor([0.0, 0.7, 1.3])
    head_tokens, rounded, _ = draft_block(torch.randn(b, k, vd if d2t is not None else v) * 3, d2t, temperature,
                                          cache_dtype)
    head_rows = rounded.clone()
    looked_up = torch.tensor([[True, True, False, False], [True, False, False, False], [False] * 4])
    # looked-up ids are odd: with a draft vocabulary (even ids) they lie outside it, as a lookup's draft may
    tokens = torch.where(looked_up, torch.tensor([[7, 9, 0, 0], [99, 0, 0, 0], [0] * 4]), head_tokens)
    cache = _cache(8, k, v, cache_dtype)
    idx_mapping = torch.tensor([5, 2, 7])
    cache_draft_logits(cache.values, idx_mapping, rounded, d2t, looked_up, tokens)
    q = _rebuilt_q(cache.values, idx_mapping, k, torch.tensor([1.0, 0.7, 1.3]))  # [b, k, V]
    assert torch.equal(q[looked_up], torch.nn.functional.one_hot(tokens[looked_up], v).float())
    cached = cache.values[idx_mapping, :k]
    head_cached = cached[..., d2t] if d2t is not None else cached
    assert torch.equal(head_cached[~looked_up], head_rows[~looked_up])  # the head's rows as drawn from


@pytest.mark.parametrize("mode", ["standard", "block"])
def test_looked_up_drafts_verify_losslessly_with_their_one_hot_rows(mode) -> None:
    """Every request's first draft is a looked-up token x (fixed by the text, not drawn), the rest the head's.
    Verified against the q rebuilt from the cache, the emitted first token follows the target's p; had the cache
    kept the head's row at x's depth, x would be judged as if drawn from that q, and the output is off."""
    from peagle_vllm.verify import verify_block, verify_standard
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(5)
    n, k, v, temp = 40000, 3, 6, 0.9
    draft_logits = torch.randn(1, k, v).expand(n, -1, -1)
    target = torch.randn(k + 1, v)
    p = (target / temp).softmax(-1)
    x = int(p[0].argsort()[v // 2])  # a token the target takes sometimes: rejected often
    head_tokens, rounded, _ = draft_block(draft_logits, None, torch.full((n,), temp), torch.float32)
    looked_up = torch.zeros(n, k, dtype=torch.bool)
    looked_up[:, 0] = True
    tokens = torch.where(looked_up, x, head_tokens)
    head_values = torch.zeros(n, k, v)
    cache_draft_logits(head_values, torch.arange(n), rounded.clone(), None)  # the head's rows everywhere
    values = torch.zeros(n, k, v)
    cache_draft_logits(values, torch.arange(n), rounded, None, looked_up, tokens)
    verifier = verify_block if mode == "block" else verify_standard
    bonus = torch.multinomial(p[k], n, replacement=True)

    def first_token_error(cached: torch.Tensor) -> float:
        q = _rebuilt_q(cached, torch.arange(n), k, torch.full((n,), temp))
        out = verifier(tokens, torch.full((n,), k), q, p[:k].expand(n, -1, -1), bonus)
        return float(((torch.bincount(out.tokens[:, 0], minlength=v).float() / n) - p[0]).abs().max())

    assert first_token_error(values) < 0.015
    assert first_token_error(head_values) > 0.05
