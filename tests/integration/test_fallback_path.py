"""A step in full fallback (adaptive depth, every request at K=0, nothing to verify) runs on vLLM's own
no-speculation path: no spec-decode metadata (vLLM's speculative path builds it on every step, drafts
or none), no rejection sampler, no drafter, no auxiliary hidden states in the target's forward, no request
for draft token ids, no draft lookahead in the KV allocation, and most steps not even a choice of the
controller; outputs stay those of plain decoding. Its sampling is that of the token after the drafts (on CPU,
top-p decided from each row's most likely tokens rather than vLLM's sort of the whole vocabulary)."""

from __future__ import annotations

from peagle_vllm.depth import FallbackHold
from peagle_vllm.harness.runs import close_llm, make_llm
from peagle_vllm.vllm_adapter.v1 import rollback_hook
from peagle_vllm.vllm_adapter.v1.bonus_sampler import CandidateTopKTopP
from peagle_vllm.vllm_adapter.v1.runner_hook import PLAIN_STEP_ATTR
from peagle_vllm.vllm_adapter.v1.sampler import PEagleRejectionSampler

# tokens per request: plain steps outnumber the rest even where a slow machine's first plain step lets the opening
# trial win, and fallback begins at the check soon after it (some 40 steps in)
MAX_TOKENS = 128


def _greedy(llm, prompts: list[str]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_a_step_in_fallback_skips_the_speculative_machinery(tiny, monkeypatch) -> None:
    """A random head (acceptance ~0): adaptive depth falls back after its opening trial; from then on
    the runner's steps are plain, and none of them reaches vLLM's spec-decode code."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from peagle_vllm.plugin import register
    from peagle_vllm.vllm_adapter.v1.proposer import PEagleProposer

    # the plugin's wrappers first, spies over them: when this test is the process's first to build an engine,
    # the spies' teardown would otherwise put back the unwrapped methods, and later engines run without them
    register()

    seen = {"plain steps": 0, "speculative steps": 0, "spec metadata": 0, "rejection sampler": 0, "draft": 0,
            "drafts asked for": 0}

    def spy(cls, name: str, key: str, count_plain: bool) -> None:
        original = getattr(cls, name)

        def wrapped(self, *args, **kwargs):
            runner = getattr(self, "_runner", self)  # the proposer keeps its runner
            plain = bool(getattr(runner, PLAIN_STEP_ATTR, False))
            if plain == count_plain:
                seen[key] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapped)

    spy(GPUModelRunner, "sample_tokens", "plain steps", True)
    spy(GPUModelRunner, "sample_tokens", "speculative steps", False)
    spy(GPUModelRunner, "_calc_spec_decode_metadata", "spec metadata", True)
    spy(PEagleRejectionSampler, "forward", "rejection sampler", True)
    spy(PEagleProposer, "propose", "draft", True)
    # the target's forward in a plain step captures none of the auxiliary hidden states only the head reads
    forward = GPUModelRunner._model_forward

    def counted_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        seen["aux hidden states" if getattr(self, PLAIN_STEP_ATTR, False) else "aux when speculating"] += \
            isinstance(out, tuple)
        return out

    monkeypatch.setattr(GPUModelRunner, "_model_forward", counted_forward)
    seen["aux hidden states"] = seen["aux when speculating"] = 0
    # after a step without a draft the engine core does not ask the worker for draft token ids (in a server,
    # a round trip to the worker process that a no-spec engine does not make)
    spy(GPUModelRunner, "take_draft_token_ids", "drafts asked for", True)
    # the scheduler then allocates KV without its per-request lookahead wrapper (no request may draft)
    without_lookahead = rollback_hook.schedule_without_lookahead

    def counted(*args, **kwargs):
        seen["schedules without lookahead"] += 1
        return without_lookahead(*args, **kwargs)

    monkeypatch.setattr(rollback_hook, "schedule_without_lookahead", counted)
    seen["schedules without lookahead"] = 0
    # and most steps skip the controller (`FallbackHold`): kept for it, given to it at the next choice
    keep = FallbackHold.keep

    def kept(self, *args, **kwargs):
        seen["steps held"] += 1
        return keep(self, *args, **kwargs)

    monkeypatch.setattr(FallbackHold, "keep", kept)
    seen["steps held"] = 0

    prompts = [f"def f{i}(x):\n" + "    return x\n" * (i % 3) for i in range(4)]
    plain = make_llm(str(tiny["target"]), None)
    expected = _greedy(plain, prompts)
    close_llm(plain)
    seen.update(dict.fromkeys(seen, 0))  # the plain engine's own steps do not count
    llm = make_llm(str(tiny["target"]), {"method": "p_eagle", "model": str(tiny["depth"]), "num_speculative_tokens": 8})
    try:
        assert _greedy(llm, prompts) == expected
    finally:
        close_llm(llm)
    assert seen["plain steps"] > 80 and seen["speculative steps"] > 0, seen  # of some 128 steps; the opening trial
    assert seen["schedules without lookahead"] > 60 and seen["steps held"] > 60, seen
    assert seen["aux when speculating"] > 0, seen  # the spy sees them where they are captured
    speculative_machinery = ("spec metadata", "rejection sampler", "draft", "drafts asked for", "aux hidden states")
    assert all(seen[key] == 0 for key in speculative_machinery), seen


def test_a_sampled_step_in_fallback_decides_top_p_from_candidates(tiny, monkeypatch) -> None:
    """Sampled requests (T=1, top-p 0.9) in fallback: every plain step's top-p mask comes from `CandidateTopKTopP`
    (vLLM's plain sampler would sort the whole vocabulary of each row), and the runner's own sampler is back after
    each step."""
    from vllm import SamplingParams
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from peagle_vllm.plugin import register

    register()
    seen = {"candidate masks": 0, "sorting samplers with top-p": 0}
    # (vLLM's sampler picks its platform's method at init: `forward_cpu` here)
    candidate_forward, sorting_forward = CandidateTopKTopP.forward, TopKTopPSampler.forward_cpu

    def candidates(self, logits, generators, k, p):
        seen["candidate masks"] += p is not None
        return candidate_forward(self, logits, generators, k, p)

    def sorting(self, logits, generators, k, p):
        seen["sorting samplers with top-p"] += p is not None
        return sorting_forward(self, logits, generators, k, p)

    monkeypatch.setattr(CandidateTopKTopP, "forward", candidates)
    monkeypatch.setattr(TopKTopPSampler, "forward_cpu", sorting)
    llm = make_llm(str(tiny["target"]), {"method": "p_eagle", "model": str(tiny["depth"]), "num_speculative_tokens": 8})
    try:
        prompts = [f"def g{i}(y):\n" for i in range(4)]
        outs = llm.generate(prompts, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True), use_tqdm=False)
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        assert runner.sampler is not runner.rejection_sampler.bonus_sampler, "the runner's sampler is put back"
    finally:
        close_llm(llm)
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outs)
    assert seen["candidate masks"] > 80, seen  # of some 128 steps, nearly all plain after the opening trial
    assert seen["sorting samplers with top-p"] == 0, seen
