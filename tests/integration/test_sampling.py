"""Sampled output through vLLM keeps the target's distribution (vLLM's own CPU path does not)."""

from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from peagle_vllm.harness.runs import close_llm, make_llm, request_spec_figures

PROMPT = "def main(argv):\n    "
REPEATING = "import os\nimport sys\nimport os\nimport sys\nimport os\nimport sys\nimport"
N = 1200


def _generate(llm, seeded: bool = True, prompt: str = PROMPT, **params) -> list:
    from vllm import SamplingParams

    sps = [SamplingParams(max_tokens=4, seed=i if seeded else None, ignore_eos=True, **params) for i in range(N)]
    return llm.generate([prompt] * N, sps, use_tqdm=False)


def _samples(llm, seeded: bool = True, prompt: str = PROMPT, **params) -> list[tuple[int, ...]]:
    return [tuple(o.outputs[0].token_ids) for o in _generate(llm, seeded, prompt, **params)]


def _same_distribution(a: list[int], b: list[int], top: int = 12) -> float:
    common = [t for t, _ in (Counter(a) + Counter(b)).most_common(top)]
    rows = [[sum(x == t for x in s) for t in common] + [sum(x not in common for x in s)] for s in (a, b)]
    rows = [[r[i] for i in range(len(r)) if rows[0][i] + rows[1][i] > 0] for r in rows]
    return chi2_contingency(rows).pvalue


def _draft_temperature(worker) -> float:
    return worker.model_runner.drafter.model.draft_temperature


@pytest.fixture(scope="module")
def engines(demo):
    # fixed K: adaptive depth may fall back to plain decoding for a large sampled batch, and these tests verify drafts
    spec = {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8, "adaptive": False}
    plain = make_llm(str(demo["target"]), None)
    # the spec engines' figures per request: vLLM's process-wide counters would mix the two
    ours = make_llm(str(demo["target"]), spec, per_request_spec_decode_metrics="summary")
    sharpened = make_llm(str(demo["target"]), {**spec, "draft_temperature": 0.5},  # drafts at T x 0.5
                         per_request_spec_decode_metrics="summary")
    # built last: vLLM's registry holds the series (lookup drafts) of the engine built last
    looked_up = make_llm(str(demo["target"]), {**spec, "prompt_lookup_max": 5},
                         per_request_spec_decode_metrics="summary")
    yield plain, ours, sharpened, looked_up
    for llm in (plain, ours, sharpened, looked_up):
        close_llm(llm)


@pytest.mark.parametrize("params,drafting", [({"temperature": 1.0}, "ours"),
                                             ({"temperature": 0.8, "top_k": 20, "top_p": 0.9}, "ours"),
                                             ({"temperature": 0.8, "top_k": 20, "top_p": 0.9}, "sharpened")])
def test_sampled_tokens_follow_the_target_distribution(engines, params: dict, drafting: str) -> None:
    plain, ours = engines[0], engines[1 if drafting == "ours" else 2]
    if drafting == "sharpened":
        assert ours.collective_rpc(_draft_temperature) == [0.5]
    a, outs = _samples(plain, **params), _generate(ours, **params)
    b, spec = [tuple(o.outputs[0].token_ids) for o in outs], request_spec_figures(outs)
    print(f"{params}: acceptance length {spec.acceptance_length:.2f}, distinct 2nd tokens "
          f"plain {len({x[1] for x in a})} p_eagle {len({x[1] for x in b})}")
    assert spec.accepted > 0, "no draft was accepted: the test would not exercise verification"
    for pos in (1, 2, 3):
        p = _same_distribution([x[pos] for x in a], [x[pos] for x in b])
        assert p > 0.001, f"position {pos}: p_eagle changes the sampled distribution (p={p:.1e})"


def test_unseeded_sampling_verified_over_the_candidates_follows_the_target_distribution(engines, monkeypatch) -> None:
    """Unseeded requests with top-k/top-p: on CPU their drafts are verified over each row's candidates."""
    from peagle_vllm.vllm_adapter.v1 import sampler

    taken, on_candidates = [], sampler.on_candidates
    monkeypatch.setattr(sampler, "on_candidates", lambda *args: taken.append(on_candidates(*args)) or taken[-1])
    params = {"temperature": 0.8, "top_k": 20, "top_p": 0.9}
    plain, ours = engines[0], engines[1]
    a, outs = _samples(plain, seeded=False, **params), _generate(ours, seeded=False, **params)
    b, spec = [tuple(o.outputs[0].token_ids) for o in outs], request_spec_figures(outs)
    assert spec.accepted > 0, "no draft was accepted: the test would not exercise verification"
    assert taken and all(t is not None for t in taken), "every step verified over the candidates"
    for pos in (1, 2, 3):
        p = _same_distribution([x[pos] for x in a], [x[pos] for x in b])
        assert p > 0.001, f"position {pos}: verification over the candidates changes the distribution (p={p:.1e})"


@pytest.mark.parametrize("seeded", [True, False])
def test_sampled_tokens_drafted_by_prompt_lookup_follow_the_target_distribution(engines, seeded: bool) -> None:
    """A prompt that repeats itself: prompt lookup drafts its continuation for sampled requests too, and those
    drafts, verified with a one-hot q (`scheduled_q`), leave the target's distribution as it was."""
    from peagle_vllm.harness.runs import lookup_draft_tokens

    plain, looked_up = engines[0], engines[3]
    prompt, params = REPEATING, {"temperature": 0.8, "top_k": 20, "top_p": 0.9}
    before = lookup_draft_tokens(looked_up)
    a = _samples(plain, seeded, prompt, **params)
    outs = _generate(looked_up, seeded, prompt, **params)
    b, spec = [tuple(o.outputs[0].token_ids) for o in outs], request_spec_figures(outs)
    drafted = lookup_draft_tokens(looked_up) - before
    print(f"acceptance length {spec.acceptance_length:.2f}, lookup drafts {drafted} of {spec.draft_tokens}")
    assert spec.accepted > 0 and drafted > spec.draft_tokens // 4, "lookup drafts were not verified"
    for pos in (0, 1, 2, 3):
        p = _same_distribution([x[pos] for x in a], [x[pos] for x in b])
        assert p > 0.001, f"position {pos}: lookup drafts change the sampled distribution (p={p:.1e})"


def test_seeded_sampling_is_reproducible(engines) -> None:
    ours = engines[1]
    assert _samples(ours, temperature=1.0)[:200] == _samples(ours, temperature=1.0)[:200]
