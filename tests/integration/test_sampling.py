"""Sampled output through vLLM keeps the target's distribution (vLLM's own CPU path does not)."""

from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from peagle_vllm.harness.runs import close_llm, make_llm, spec_figures

PROMPT = "def main(argv):\n    "
N = 1200


def _samples(llm, **params) -> list[tuple[int, ...]]:
    from vllm import SamplingParams

    sps = [SamplingParams(max_tokens=4, seed=i, ignore_eos=True, **params) for i in range(N)]
    return [tuple(o.outputs[0].token_ids) for o in llm.generate([PROMPT] * N, sps, use_tqdm=False)]


def _same_distribution(a: list[int], b: list[int], top: int = 12) -> float:
    common = [t for t, _ in (Counter(a) + Counter(b)).most_common(top)]
    rows = [[sum(x == t for x in s) for t in common] + [sum(x not in common for x in s)] for s in (a, b)]
    rows = [[r[i] for i in range(len(r)) if rows[0][i] + rows[1][i] > 0] for r in rows]
    return chi2_contingency(rows).pvalue


@pytest.fixture(scope="module")
def engines(demo):
    plain = make_llm(str(demo["target"]), None)
    ours = make_llm(str(demo["target"]), {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8})
    yield plain, ours
    close_llm(plain)
    close_llm(ours)


@pytest.mark.parametrize("params", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 20, "top_p": 0.9}])
def test_sampled_tokens_follow_the_target_distribution(engines, params: dict) -> None:
    plain, ours = engines
    before = spec_figures(ours)
    a, b = _samples(plain, **params), _samples(ours, **params)
    spec = spec_figures(ours).minus(before)
    print(f"{params}: acceptance length {spec.acceptance_length:.2f}, distinct 2nd tokens "
          f"plain {len({x[1] for x in a})} p_eagle {len({x[1] for x in b})}")
    assert spec.accepted > 0, "no draft was accepted: the test would not exercise verification"
    for pos in (1, 2, 3):
        p = _same_distribution([x[pos] for x in a], [x[pos] for x in b])
        assert p > 0.001, f"position {pos}: p_eagle changes the sampled distribution (p={p:.1e})"


def test_seeded_sampling_is_reproducible(engines) -> None:
    _, ours = engines
    assert _samples(ours, temperature=1.0)[:200] == _samples(ours, temperature=1.0)[:200]
