"""Prompt and corpus lookup beside the head (`prompt_lookup_max`, `lookup_corpus`) in a real vLLM engine on the CPU
backend: greedy output stays the target's, lookup drafts are accepted where the text repeats or the corpus holds
it, past the head's depth too. (Sampled requests with lookup drafts keep the target's distribution:
`test_sampling.py`.)"""

from __future__ import annotations

import json

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.runs import close_llm, generate, lookup_draft_tokens, make_llm, request_spec_figures


def p_eagle(model, **extra) -> dict:
    return {"method": "p_eagle", "model": str(model), "num_speculative_tokens": 8, **extra}


def corpus_of_first_answers(target, prompts: list[str], greedy, out) -> list:
    """The target's greedy outputs for `prompts`; the first 4 written to `out` as `peagle-vllm distill` writes
    answers (a lookup corpus)."""
    plain = make_llm(str(target), None)
    answers = plain.generate(prompts, greedy, use_tqdm=False)
    close_llm(plain)
    (out / "chunk-0000.jsonl").write_text("".join(
        json.dumps({"prompt_ids": list(o.prompt_token_ids), "response_ids": list(o.outputs[0].token_ids)}) + "\n"
        for o in answers[:4]))
    return answers


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


def test_corpus_lookup_drafts_the_answers_it_holds(demo, tmp_path) -> None:
    """A corpus of the demo target's greedy answers to 4 of 8 prompts, as `peagle-vllm distill` writes them: with
    it, all 8 answers stay the target's, and the 4 it holds are drafted nearly whole (accepted far more often)."""
    from vllm import SamplingParams

    prompts, params = held_out_prompts(8), SamplingParams(temperature=0, max_tokens=64)
    answers = corpus_of_first_answers(demo["target"], prompts, params, tmp_path)
    llm = make_llm(str(demo["target"]), p_eagle(demo["draft"], adaptive=False, lookup_corpus=str(tmp_path)),
                   per_request_spec_decode_metrics="summary")
    outs = llm.generate(prompts, params, use_tqdm=False)
    looked_up = lookup_draft_tokens(llm)
    close_llm(llm)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in answers]
    held, new = request_spec_figures(outs[:4]), request_spec_figures(outs[4:])
    print(f"acceptance length: answers in the corpus {held.acceptance_length:.2f}, others {new.acceptance_length:.2f}")
    assert held.acceptance_length > new.acceptance_length + 3 and looked_up > 0


def test_past_the_heads_depth_only_lookups_draft(demo, tmp_path) -> None:
    """K=8 with `head_depth` 2, prompt lookup and a corpus of the greedy answers to 4 of 8 prompts, in one batch
    with sampled requests: the greedy answers stay the target's, and those the corpus holds are drafted past the
    head's 2 depths (more than 3 tokens a step, the most the head alone could give); the sampled requests, on the
    prompts the corpus holds, are drafted past them too where their text follows the corpus."""
    from vllm import SamplingParams

    prompts = held_out_prompts(8)
    greedy, sampled = SamplingParams(temperature=0, max_tokens=64), SamplingParams(temperature=1.0, seed=7,
                                                                                   max_tokens=64)
    answers = corpus_of_first_answers(demo["target"], prompts, greedy, tmp_path)
    llm = make_llm(str(demo["target"]), p_eagle(demo["draft"], adaptive=False, prompt_lookup_max=5, head_depth=2,
                                                lookup_corpus=str(tmp_path)), per_request_spec_decode_metrics="summary")
    outs = llm.generate(prompts + prompts[:4], [greedy] * 8 + [sampled] * 4, use_tqdm=False)
    close_llm(llm)
    assert [o.outputs[0].token_ids for o in outs[:8]] == [o.outputs[0].token_ids for o in answers]
    held, drawn = request_spec_figures(outs[:4]), request_spec_figures(outs[8:])
    print(f"acceptance length: answers in the corpus {held.acceptance_length:.2f}, sampled requests "
          f"{drawn.acceptance_length:.2f} ({drawn.draft_tokens} drafts in {drawn.drafts} steps)")
    assert held.acceptance_length > 3
    assert drawn.drafts and drawn.draft_tokens > 2 * drawn.drafts
