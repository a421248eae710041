"""Worker-side hooks on `vllm.v1.worker.gpu_model_runner.GPUModelRunner` (the CPU runner reaches them
through super()). `__init__`: for a p_eagle config, the drafter becomes PEagleProposer and the
rejection sampler PEagleRejectionSampler (the drafter loads its weights later, in load_model).
`_update_states`: block lists the scheduler cut after a rejection are cut here too before the step's
new blocks are appended, the step's draft depth (adaptive depth) and the positions of the drafts lookups gave
are kept, and, as a test aid, stale KV is poisoned. `_get_spec_decode_draft_probs`: the sampler's q is laid out
from the drafts verified, one-hot where a lookup drafted (`scheduled_q`). `sample_tokens`: the step's output
carries the draft time to the scheduler (which sends it on to the front end's metrics), an async output once its
result is read; CPU generators saved by `generator_hook` are put back after it.
A plain step (adaptive depth: nothing to verify and no draft to follow, every request in fallback)
runs `execute_model` and `sample_tokens` with the runner's speculative config set aside, i.e. on
vLLM's own no-speculation path: no spec-decode metadata, no drafter, and a target forward without the
auxiliary hidden states only the head reads (and the engine core does not ask for draft token ids after a
depth-0 step: `scheduler_hook`'s post_step); it samples as the token after the drafts is sampled (`bonus_sampler`).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput

from peagle_vllm.scheduled_q import scheduled_draft_probs
from peagle_vllm.truncation import CPU_CANDIDATES
from peagle_vllm.vllm_adapter.v1 import carriers, generator_hook, rollback_hook
from peagle_vllm.vllm_adapter.v1.carriers import is_marked, mark_of


def wrap_init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, device, *args, **kwargs):
        original(self, vllm_config, device, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is None or not is_marked(spec) or not hasattr(self, "drafter"):
            return
        from peagle_vllm.vllm_adapter.v1.proposer import PEagleProposer
        from peagle_vllm.vllm_adapter.v1.sampler import PEagleRejectionSampler

        self.drafter = PEagleProposer(vllm_config, device, self)
        registry = getattr(self, "jit_warmup_registry", None)
        with registry.activate() if registry is not None else contextlib.nullcontext():
            options = mark_of(spec).options
            # max_rows: the requests `_dummy_sampler_run` samples in vLLM's profile run (one draft each)
            on_cpu = torch.device(device).type == "cpu"
            self.rejection_sampler = PEagleRejectionSampler(self.sampler, spec, device, verify_mode=options.verify,
                                                            verifier_accept_k=options.verifier_accept_k,
                                                            accept_tolerance=options.accept_tolerance,
                                                            max_rows=min(self.max_num_tokens, self.max_num_reqs),
                                                            top_p_candidates=CPU_CANDIDATES if on_cpu else None)

    return __init__


def wrap_update_states(original):
    @functools.wraps(original)
    def _update_states(self, scheduler_output):
        rollback_hook.apply_block_counts(self, scheduler_output)
        self.peagle_draft_depth = carriers.draft_depth(scheduler_output)
        self.peagle_lookup_positions = carriers.lookup_positions(scheduler_output)
        out = original(self, scheduler_output)
        mode = rollback_hook.poison_mode()
        if mode is not None:
            rollback_hook.poison_stale_kv(self, mode)
        return out

    return _update_states


def wrap_get_spec_decode_draft_probs(original):
    @functools.wraps(original)
    def _get_spec_decode_draft_probs(self, spec_decode_metadata):
        """vLLM's flat draft_probs [num_draft_tokens, V] for the rejection sampler, laid out from the drafts this
        step verifies rather than from the head's: one-hot where a lookup drafted (`scheduled_q`)."""
        head_q, req_ids = self._draft_probs, self._draft_prob_req_ids
        lookups = getattr(self, "peagle_lookup_positions", None) or {}
        if head_q is None or req_ids is None or (
                not lookups and max(spec_decode_metadata.num_draft_tokens, default=0) <= head_q.shape[1]):
            return original(self, spec_decode_metadata)  # (vLLM's layout is the drafts')
        row_of = {rid: i for i, rid in enumerate(req_ids)}
        verifying = [(rid, n) for rid, n in zip(self.input_batch.req_ids, spec_decode_metadata.num_draft_tokens)
                     if n]
        if any(rid not in row_of for rid, _ in verifying):
            return original(self, spec_decode_metadata)  # (vLLM's own warning and fallback)
        return scheduled_draft_probs(head_q, [row_of[rid] for rid, _ in verifying], [n for _, n in verifying],
                                     [lookups.get(rid, ()) for rid, _ in verifying],
                                     spec_decode_metadata.draft_token_ids)

    return _get_spec_decode_draft_probs


def wrap_input_fits_in_drafter(original):
    @functools.wraps(original)
    def _input_fits_in_drafter(self, *args, **kwargs):
        """Depth 0 (every request in fallback): vLLM's own no-draft path, which skips the drafter's
        input preparation as well as its forward."""
        return getattr(self, "peagle_draft_depth", None) != 0 and original(self, *args, **kwargs)

    return _input_fits_in_drafter


PLAIN_STEP_ATTR = "peagle_plain_step"  # runner attribute: the current step runs without speculation


AUX_HOLDER_ATTR = "_peagle_aux_holder"  # runner attribute: `_aux_holder`'s finding, made once
_UNSEEN = object()


def _aux_holder(runner):
    """The target's module that captures EAGLE-3's auxiliary hidden states (`aux_hidden_state_layers`), found as
    vLLM's `set_aux_hidden_state_layers` finds it, once per runner; None when the runner does not ask for them,
    or runs the model other than eagerly (a compiled or graph-captured forward keeps the outputs it was traced
    with, whatever the attribute says then)."""
    holder = runner.__dict__.get(AUX_HOLDER_ATTR, _UNSEEN)
    if holder is _UNSEEN:
        holder = None
        eager = getattr(getattr(runner, "model_config", None), "enforce_eager", False)
        if eager and getattr(runner, "use_aux_hidden_state_outputs", False):
            model = getattr(runner, "model", None)
            parent = model.get_language_model() if hasattr(model, "get_language_model") else getattr(
                model, "language_model", model)
            holder = getattr(parent, "model", parent)
            holder = holder if getattr(holder, "aux_hidden_state_layers", ()) else None
        runner.__dict__[AUX_HOLDER_ATTR] = holder
    return holder


def _call_plain(runner, call, args: tuple, kwargs: dict, holder=None):
    """`call(runner, *args, **kwargs)` with the runner as vLLM builds it without a speculative config, sampling
    with the sampler of the token after the drafts (`bonus_sampler`: vLLM's own, on CPU with top-k/top-p decided
    from each row's most likely tokens; the same mask, so the same tokens, as vLLM's sort of the whole vocabulary);
    given the `_aux_holder`, also a target forward without the auxiliary hidden states only the draft head reads (a
    plain step runs no draft, and the head's catch-up computes its tokens again; each captured layer is one more
    tensor operation per forward: in this engine at c=4, some 20 us of a 4.7 ms step). Plain try/finally rather
    than context managers: this runs on every step in fallback."""
    saved, runner.speculative_config = runner.speculative_config, None
    sampler, runner.sampler = runner.sampler, runner.rejection_sampler.bonus_sampler
    if holder is not None:
        layers, holder.aux_hidden_state_layers = holder.aux_hidden_state_layers, ()
        runner.use_aux_hidden_state_outputs = False
    try:
        return call(runner, *args, **kwargs)
    finally:
        runner.speculative_config, runner.sampler = saved, sampler
        if holder is not None:
            holder.aux_hidden_state_layers, runner.use_aux_hidden_state_outputs = layers, True


def _is_plain_step(scheduler_output) -> bool:
    """A step with no drafts to verify whose depth is 0 (no draft follows it); only a p_eagle
    scheduler with adaptive depth sends a depth."""
    return carriers.draft_depth(scheduler_output) == 0 and not scheduler_output.scheduled_spec_decode_tokens


def wrap_execute_model(original):
    @functools.wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        """A plain step costs what it costs in an engine without speculation."""
        plain = _is_plain_step(scheduler_output)
        setattr(self, PLAIN_STEP_ATTR, plain)
        if not plain:
            return original(self, scheduler_output, *args, **kwargs)
        return _call_plain(self, original, (scheduler_output, *args), kwargs, _aux_holder(self))

    return execute_model


def wrap_sample_tokens(original):
    @functools.wraps(original)
    def sample_tokens(self, *args, **kwargs):
        """Attaches (draft runs, seconds) finished since the last step to this step's output. A plain step runs no
        draft and samples as vLLM's runner without speculation does, with the sampler of the token after the drafts
        (`_call_plain`). Either way, the CPU generators `generator_hook` saved are put back afterwards."""
        try:
            if getattr(self, PLAIN_STEP_ATTR, False):
                return _call_plain(self, original, args, kwargs)
            out = original(self, *args, **kwargs)
            timer = getattr(getattr(self, "drafter", None), "draft_timer", None)
            if timer is not None and out is not EMPTY_MODEL_RUNNER_OUTPUT:
                attach_draft_time(out, *timer.take())
            return out
        finally:
            generator_hook.restore_saved_generators(self)

    return sample_tokens


def attach_draft_time(out, runs: int, seconds: float) -> None:
    """Drafts timed since the last step onto a step's own output: a ModelRunnerOutput now, an async one's result
    when it is read (under async scheduling; the timer is drained every step either way, so its CUDA events
    never pile up)."""
    if not runs:
        return
    if isinstance(out, ModelRunnerOutput):
        carriers.set_draft_time(out, runs, seconds)
    elif isinstance(out, AsyncModelRunnerOutput):
        get_output = out.get_output

        def get_output_with_draft_time() -> ModelRunnerOutput:
            result = get_output()
            carriers.set_draft_time(result, runs, seconds)
            return result

        out.get_output = get_output_with_draft_time
