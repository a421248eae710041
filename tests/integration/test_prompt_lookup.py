"""Prompt lookup beside the head (`prompt_lookup_max`) in a real vLLM engine on the CPU backend: greedy output
stays the target's, lookup drafts are accepted where the text repeats, and sampled requests keep the head's."""

from __future__ import annotations

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.runs import close_llm, generate, make_llm

def p_eagle(model, **extra) -> dict:
    return {"method": "p_eagle", "model": str(model), "num_speculative_tokens": 8, **extra}


def test_greedy_identical_and_accepted_more_with_lookup(demo) -> None:
    """The demo target on held-out prompts, 128 tokens: its text repeats itself, which lookup drafts."""
    target, prompts = str(demo["target"]), held_out_prompts(8)
    base = generate(target, None, prompts, 128)
    head_only = generate(target, p_eagle(demo["draft"], adaptive=False), prompts, 128)
    fixed = generate(target, p_eagle(demo["draft"], adaptive=False, prompt_lookup_max=5), prompts, 128)
    adaptive = generate(target, p_eagle(demo["draft"], prompt_lookup_max=5), prompts, 128)
    assert fixed.token_ids == base.token_ids and adaptive.token_ids == base.token_ids
    assert head_only.token_ids == base.token_ids
    print(f"acceptance length: head {head_only.spec.acceptance_length:.2f}, with lookup "
          f"{fixed.spec.acceptance_length:.2f} (adaptive {adaptive.spec.acceptance_length:.2f})")
    assert fixed.spec.acceptance_length > head_only.spec.acceptance_length + 0.5


def test_sampled_requests_beside_greedy_ones_keep_the_heads_drafts(demo) -> None:
    """One batch of greedy and seeded sampled requests on the demo target: the greedy ones equal plain greedy
    decoding, with drafts from lookup among them; the sampled ones equal what the same engine without lookup
    samples (their drafts, and so their draws, are the head's)."""
    from vllm import SamplingParams

    prompts = held_out_prompts(8)
    greedy, sampled = SamplingParams(temperature=0, max_tokens=64), SamplingParams(temperature=1.0, seed=7,
                                                                                   max_tokens=64)
    params = [greedy if i % 2 else sampled for i in range(len(prompts))]
    outputs, looked_up = {}, 0.0
    for name, spec in (("plain", None), ("head", p_eagle(demo["draft"], adaptive=False)),
                       ("lookup", p_eagle(demo["draft"], adaptive=False, prompt_lookup_max=5))):
        llm = make_llm(str(demo["target"]), spec)
        outputs[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        if name == "lookup":  # (vLLM's registry holds the series of the engine built last)
            looked_up = sum(float(m.value) for m in llm.get_metrics() if m.name == "peagle:lookup_draft_tokens")
        close_llm(llm)
    odd = slice(1, None, 2)
    assert outputs["lookup"][odd] == outputs["plain"][odd]  # greedy
    assert looked_up > 0
    assert outputs["lookup"][::2] == outputs["head"][::2]  # seeded, sampled
