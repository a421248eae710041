"""KV-cache rollback in a real engine: stale KV is never read, surplus blocks go back early, and each
request's lookahead follows its own K."""

from __future__ import annotations

import pytest

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.kv_budget import run as kv_run
from peagle_vllm.harness.runs import close_llm, make_llm, spec_figures
from peagle_vllm.vllm_adapter.v1.rollback_hook import POISON_ENV


def _p_eagle(model, k: int, **extra) -> dict:
    return {"method": "p_eagle", "model": str(model), "num_speculative_tokens": k, **extra}


def _greedy(llm, prompts: list[str], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_poisoned_stale_kv_is_never_read_nor_prefix_cached(demo, monkeypatch) -> None:
    """A huge value is written into every slot past each request's committed length before every step (target
    and draft layers). Outputs stay identical to plain decoding, including for follow-up requests
    that hit prefix-cached blocks written during speculation. Control: poisoning one committed
    position more changes the outputs, so the poison does reach what attention reads."""
    prompts = held_out_prompts(6, min_chars=40, max_chars=600)
    plain = make_llm(str(demo["target"]), None)
    base = _greedy(plain, prompts, 48)
    tok = plain.get_tokenizer()
    follow_ups = [p + tok.decode(t) for p, t in zip(prompts, base)]
    base_follow = _greedy(plain, follow_ups, 24)
    close_llm(plain)

    # fixed K: rollback needs speculative steps, which adaptive depth may replace by plain ones here
    llm = make_llm(str(demo["target"]), _p_eagle(demo["draft"], 8, adaptive=False), enable_prefix_caching=True)
    monkeypatch.setenv(POISON_ENV, "1")
    before = spec_figures(llm)
    assert _greedy(llm, prompts, 48) == base
    spec = spec_figures(llm).minus(before)
    assert spec.draft_tokens > spec.accepted > 0, "the run must have rejected drafts to roll back"
    assert _greedy(llm, follow_ups, 24) == base_follow
    monkeypatch.setenv(POISON_ENV, "control")
    assert _greedy(llm, prompts, 48) != base
    close_llm(llm)


@pytest.fixture(scope="module")
def shallow(tiny) -> dict:
    """A random head (acceptance ~0) at K=32 on 16 concurrent requests, block size 32: adaptive depth
    (lookahead per request, early release) against fixed K=32, and plain decoding."""
    prompts = [f"def f{i}(x):\n" + "    return x\n" * (i % 5) for i in range(16)]
    args = (prompts, 96, 32)
    return {
        "plain": kv_run(str(tiny["target"]), None, *args),
        "fixed": kv_run(str(tiny["target"]), _p_eagle(tiny["depth"], 32, adaptive=False), *args),
        "adaptive": kv_run(str(tiny["target"]), _p_eagle(tiny["depth"], 32), *args),
    }


def test_lookahead_follows_each_requests_own_k(shallow) -> None:
    plain, fixed, adaptive = shallow["plain"], shallow["fixed"], shallow["adaptive"]
    print({name: fig.summary() for name, fig in shallow.items()})
    assert fixed.token_ids == plain.token_ids and adaptive.token_ids == plain.token_ids
    assert adaptive.peak_blocks < fixed.peak_blocks
    assert adaptive.mean_blocks < fixed.mean_blocks


def test_surplus_blocks_are_released_before_the_request_ends(shallow) -> None:
    adaptive, fixed = shallow["adaptive"], shallow["fixed"]
    assert adaptive.released_early > 0  # K fell from its start value: the extra lookahead went back
    assert fixed.released_early == 0  # fixed K never needs less than it holds
    assert adaptive.end_blocks == fixed.end_blocks == 0
