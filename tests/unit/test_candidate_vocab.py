"""Verification over each draft row's kept candidates (`candidate_vocab`): lossless in distribution (test_verify's
chi-square simulation), the same accepted drafts as over the whole vocabulary from the same random numbers, and
the CPU rejection sampler taking that path exactly where the candidates hold every token top-k/top-p keep."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from peagle_vllm.candidate_vocab import Slots, candidate_rows, widened
from peagle_vllm.truncation import kept_candidates
from peagle_vllm.verify import target_probs, verify
from tests.unit.test_verify import V, ToyModels, assert_matches_target, simulate


def on_slots(mode: str, candidates: int, one_hot: bool = False, width: int | None = None):
    """A `simulate` sampler: p [B, K, V] cut to its `candidates` most likely tokens (padded to `width` by `widened`),
    verified over them."""

    def sampler(drafts, num_draft, q, p, bonus):
        b, k = drafts.shape
        p_c, ids = p.topk(candidates, dim=-1)  # [B, K, C]
        assert torch.allclose(p_c.sum(-1), torch.ones(b, k)), "the candidates hold all of p"
        ids, kept = widened(ids.reshape(b * k, -1), p_c.reshape(b * k, -1).log(), width or candidates)
        rows = candidate_rows(drafts.reshape(-1), ids, kept.softmax(-1), None if one_hot else q.reshape(b * k, -1))
        slots = Slots(rows.ids.view(b, k, -1), rows.drafts.view(b, k))
        return verify(mode, drafts, num_draft, None if rows.q is None else rows.q.view(b, k, -1),
                      rows.p.view(b, k, -1), p.argmax(-1), bonus, torch.zeros(b, dtype=torch.bool), slots=slots)

    return sampler


@pytest.mark.parametrize("temperature,top_k,top_p,width", [(1.0, 2, 1.0, None), (1.3, 3, 0.8, None),
                                                             (1.0, 2, 1.0, 6)])
@pytest.mark.parametrize("mode", ["standard", "block"])
def test_verification_over_the_candidates_is_lossless(mode: str, temperature: float, top_k: int, top_p: float,
                                                      width: int | None) -> None:
    """q has the whole vocabulary, p at most 3 of its 4 tokens: drafts outside p's candidates take the extra slot;
    rows padded to 6 slots repeat a candidate at p = 0."""
    models = ToyModels(seed=3, temperature=temperature, top_k=top_k, top_p=top_p)
    cells, accepted = simulate(models, on_slots(mode, candidates=3, width=width), seed=11)
    assert_matches_target(cells, models, f"{mode} verification over the candidates")
    assert accepted > 0.3, "drafts are accepted"


def test_one_hot_drafts_over_the_candidates_are_lossless() -> None:
    models = ToyModels(seed=7, temperature=1.0, top_k=2, top_p=1.0)
    models.q = torch.nn.functional.one_hot(models.q.argmax(-1), V).float()
    cells, _ = simulate(models, on_slots("standard", candidates=2, one_hot=True), seed=2)
    assert_matches_target(cells, models, "one-hot drafts over the candidates")


@pytest.mark.parametrize("mode", ["standard", "block"])
def test_the_same_random_numbers_accept_the_same_drafts_as_the_whole_vocabulary(mode: str) -> None:
    b, k, vocab, c = 512, 4, 300, 40
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b * k, vocab, generator=g) * 4
    temperature, top_p = torch.full((b * k,), 0.9), torch.full((b * k,), 0.8)
    ids, kept, whole = kept_candidates(logits / 0.9, None, top_p, c)
    assert bool(whole.all()), "peaked rows: the candidates hold every kept token"
    p = target_probs(logits, temperature, top_p=top_p)  # [B*K, V], the whole vocabulary
    q = (torch.randn(b * k, vocab, generator=g) * 2).softmax(-1)
    drafts = torch.multinomial(q, 1, generator=g).view(b, k)
    num_draft = torch.randint(1, k + 1, (b,), generator=g)
    bonus, greedy = torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.bool)
    p_bkv = p.view(b, k, vocab)
    torch.manual_seed(1)
    whole_vocab = verify(mode, drafts, num_draft, q.view(b, k, vocab), p_bkv, p_bkv.argmax(-1), bonus, greedy)
    rows = candidate_rows(drafts.reshape(-1), ids, kept.softmax(-1), q)
    torch.manual_seed(1)
    candidates = verify(mode, drafts, num_draft, rows.q.view(b, k, -1), rows.p.view(b, k, -1), p_bkv.argmax(-1),
                        bonus, greedy, slots=Slots(rows.ids.view(b, k, -1), rows.drafts.view(b, k)))
    assert torch.equal(candidates.num_accepted, whole_vocab.num_accepted)
    assert 0 < whole_vocab.num_accepted.float().mean() < num_draft.float().mean(), "some drafts accepted, some not"
    emitted = candidates.num_accepted < num_draft  # a token drawn from the residual, by the slot's id
    drawn = candidates.tokens[emitted, candidates.num_accepted[emitted]]
    rows_of = torch.arange(b)[emitted] * k + candidates.num_accepted[emitted]
    assert bool((p[rows_of, drawn] > 0).all()), "every drawn token is one the target keeps"


def test_candidate_rows_put_a_draft_outside_the_candidates_in_its_own_slot() -> None:
    ids = torch.tensor([[5, 2, 9], [5, 2, 9]])
    p = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    q = torch.zeros(2, 12)
    q[:, 2], q[:, 7] = 0.25, 0.75
    rows = candidate_rows(torch.tensor([2, 7]), ids, p, q)
    assert rows.drafts.tolist() == [1, 3]
    assert rows.ids.tolist() == [[5, 2, 9, 2], [5, 2, 9, 7]]
    assert torch.equal(rows.p, torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.5, 0.3, 0.2, 0.0]]))
    assert torch.equal(rows.q, torch.tensor([[0.0, 0.25, 0.0, 0.0], [0.0, 0.25, 0.0, 0.75]])), "q at the draft once"


@pytest.fixture
def cpu_sampler():
    """PEagleRejectionSampler as on CPU (top-k/top-p from 16 candidates), and a step's inputs: 6 requests, 3 drafts
    each, over 400 tokens; requests 0-1 greedy, request 3 seeded when `seeded`, request 4 without top-p when
    `untruncated`, request 5's logits divided by `flatter` (3: top-p keeps 22-51 tokens, 80: nearly all)."""
    pytest.importorskip("vllm")
    import vllm._custom_ops  # noqa: F401  (the CPU sampler's kernels)
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from peagle_vllm.vllm_adapter.v1 import sampler as module

    b, k, vocab = 6, 3, 400

    def step(flatter: float, seeded: bool, untruncated: bool):
        g = torch.Generator().manual_seed(4)
        logits = torch.randn(b * (k + 1), vocab, generator=g) * 8
        logits[5 * (k + 1):] /= flatter
        q = (logits.view(b, k + 1, vocab)[:, :k].reshape(b * k, vocab) * 0.7).softmax(-1)  # close to the target's
        drafts = torch.multinomial(q, 1, generator=g).view(b, k)
        rows = torch.arange(b * (k + 1), dtype=torch.int32).view(b, k + 1)  # request b's k + 1 rows of logits
        meta = replace(SpecDecodeMetadata.make_dummy(drafts.tolist(), torch.device("cpu")),
                       target_logits_indices=rows[:, :k].reshape(-1), bonus_logits_indices=rows[:, k])
        temperature = torch.tensor([0.0, 0.0, 1.0, 0.8, 1.0, 1.0])
        sm = SamplingMetadata(
            temperature=temperature, all_greedy=False, all_random=False, top_k=None,
            top_p=torch.tensor([0.9, 0.9, 0.9, 0.9, 1.0 if untruncated else 0.9, 0.9]),
            generators={3: torch.Generator().manual_seed(9)} if seeded else {}, max_num_logprobs=None,
            no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(b),
            presence_penalties=torch.zeros(b), repetition_penalties=torch.ones(b), output_token_ids=[[]] * b,
            allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
        return meta, q, logits, sm

    taken = []
    on_candidates = module.on_candidates
    sampler = module.PEagleRejectionSampler(Sampler(), None, "cpu", top_p_candidates=16)

    def run(flatter: float = 1.0, seeded: bool = False, candidates: bool = True, untruncated: bool = False):
        def spy(*args):
            taken.append(on_candidates(*args) if candidates else None)
            return taken[-1]

        meta, q, logits, sm = step(flatter, seeded, untruncated)
        module.on_candidates = spy
        try:
            torch.manual_seed(0)
            return sampler(meta, q, logits, sm).sampled_token_ids
        finally:
            module.on_candidates = on_candidates

    return run, taken


def test_the_cpu_sampler_verifies_over_the_candidates_and_accepts_what_the_whole_vocabulary_does(cpu_sampler) -> None:
    run, taken = cpu_sampler
    small = run()
    assert taken[-1] is not None and taken[-1].p.shape[1] == 17, "16 candidates and the draft's slot"
    whole = run(candidates=False)
    accepted = lambda out: (out >= 0).sum(1)  # noqa: E731
    assert torch.equal(accepted(small), accepted(whole))
    assert 0 < int((accepted(small)[2:] - 1).sum()) < 12, "the sampled rows accept some drafts and reject others"
    assert torch.equal(small[:2], whole[:2]), "greedy rows alike"


def test_a_row_too_flat_for_its_candidates_tries_eight_times_as_many(cpu_sampler) -> None:
    run, taken = cpu_sampler
    wide = run(flatter=3)
    assert taken[-1] is not None and taken[-1].p.shape[1] == 129, "every row 128 candidates wide, and the draft's slot"
    assert bool((taken[-1].p[:15, 16:128] == 0).all()), "requests 0-4's rows: 16 candidates, padded at p = 0"
    whole = run(flatter=3, candidates=False)
    assert torch.equal((wide >= 0).sum(1), (whole >= 0).sum(1))


def test_a_row_too_flat_for_its_candidates_an_untruncated_row_or_a_seed_keeps_the_whole_vocabulary(cpu_sampler) -> None:
    run, taken = cpu_sampler
    run(flatter=80)
    assert taken == [None], "a sampled row whose top-p reaches past 8 x 16 candidates"
    run(untruncated=True)
    assert taken == [None, None], "a sampled row without top-k/top-p keeps the whole vocabulary"
    out = run(seeded=True)
    assert len(taken) == 2, "a seeded request: not asked"
    assert out.shape == (6, 4) and bool((out[:, 0] >= 0).all())
