"""After steps that ran no draft (adaptive depth's fallback), a request that drafts again has the tokens
it decoded meanwhile computed again, so the draft head's KV has them: its drafts are then those of an
engine that drafted on every step, position by position, and outputs stay those of greedy decoding."""

from __future__ import annotations

from peagle_vllm.depth import DepthController
from peagle_vllm.harness.runs import close_llm, make_llm
from peagle_vllm.vllm_adapter.v1.rollback_hook import POISON_ENV
from peagle_vllm.vllm_adapter.v1.scheduler_state import state_of

GAP = range(8, 38)  # controller steps forced plain (every request at K=0): 30 tokens, one catch-up's worth
CHOOSE, RESERVATION = DepthController.choose, DepthController.reservation


def _force_gap(monkeypatch, head_idle: bool) -> None:
    """The real controller (with min_k = K: K everywhere), except that its choices on the steps of GAP are K=0;
    with `head_idle` nothing is reserved for them either, so no draft runs (as in fallback), else the head still
    drafts every step of the gap, with nothing verified: the same steps, the same tokens, a head that never
    stopped."""

    def forced_choose(self, req_ids, caps=None, sampled=False):
        ks = CHOOSE(self, req_ids, caps, sampled)
        if self.steps in GAP:
            for rid in req_ids:
                self.acceptance.stats(rid).last_k = 0
            return [0] * len(req_ids)
        return ks

    def forced_reservation(self, req_id, batch=None):
        return 0 if head_idle and self.steps + 1 in GAP else RESERVATION(self, req_id, batch)

    monkeypatch.setattr(DepthController, "choose", forced_choose)
    monkeypatch.setattr(DepthController, "reservation", forced_reservation)


def _run(demo, spec: dict, prompts: list[str]) -> tuple[list[list[int]], dict[tuple[int, int], list[int]], object]:
    """Greedy outputs, the drafts of each step after GAP keyed by (prompt, position of the first draft),
    and the scheduler's head-gap bookkeeping (None without adaptive depth)."""
    from vllm import SamplingParams

    # one request at a time, in prompt order; no prefix caching, whose blocks are never computed again
    llm = make_llm(str(demo["target"]), spec, max_num_seqs=1, enable_prefix_caching=False)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    state = state_of(scheduler)
    controller = state.ctrl if state is not None else None
    drafts: dict[tuple[int, int], list[int]] = {}
    order: dict[tuple[int, ...], int] = {}
    update = scheduler.update_draft_token_ids

    def record(draft_token_ids):
        for rid, ids in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            request = scheduler.requests.get(rid)
            if request is None:  # finished in this step: its drafts are dropped
                continue
            prompt = order.setdefault(tuple(request.prompt_token_ids), len(order))
            if controller is None or controller.steps >= GAP.stop:  # the head drafted as deep as reserved
                depth = state.reserved.get(rid, len(ids)) if controller is not None else len(ids)
                drafts[(prompt, request.num_tokens)] = list(ids)[:depth]
        return update(draft_token_ids)

    scheduler.update_draft_token_ids = record
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True), use_tqdm=False)
    gaps = state.gaps if controller is not None else None
    close_llm(llm)
    return [list(o.outputs[0].token_ids) for o in outs], drafts, gaps


def test_drafts_after_a_gap_match_an_engine_that_never_stopped_drafting(demo, monkeypatch) -> None:
    from peagle_vllm.harness.corpus import held_out_prompts

    prompts = held_out_prompts(2, seed=4)
    # min_k = K: no fallback of its own, and the same steps in both runs (positions line up draft for draft)
    spec = {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 4, "min_k": 4}
    # every slot past a request's committed length holds a huge value before each step, so the head's
    # slots left unwritten by the gap would change its drafts if the catch-up did not write them
    monkeypatch.setenv(POISON_ENV, "1")
    _force_gap(monkeypatch, head_idle=False)
    expected, reference, drafting = _run(demo, spec, prompts)
    _force_gap(monkeypatch, head_idle=True)
    outputs, drafts, gaps = _run(demo, spec, prompts)
    assert outputs == expected
    assert drafting.caught_up == 0 and gaps.caught_up >= len(GAP)
    after_gap = sorted(key for key in drafts if key[0] == 0)  # the request with the gap
    assert len(after_gap) >= 10 and set(drafts) == set(reference)
    for key in after_gap:
        assert drafts[key] == reference[key], f"drafts differ at position {key[1]} of prompt {key[0]}"
