"""Worker-side hook on `vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__` (the CPU runner
reaches it through super()): for a p_eagle config, the drafter becomes PEagleProposer and the
rejection sampler PEagleRejectionSampler. The drafter loads its weights later, in load_model.
Also wraps `GPUModelRunner._update_states`: block lists the scheduler cut after a rejection are cut
here too before the step's new blocks are appended, the step's draft depth (adaptive depth) is
kept for the proposer, and, as a test aid, stale KV is poisoned. And `sample_tokens`: the step's
output carries the draft time to the scheduler (which sends it on to the front end's metrics).
"""

from __future__ import annotations

import contextlib
import functools

from vllm.v1.outputs import ModelRunnerOutput

from peagle_vllm.vllm_adapter import rollback_hook
from peagle_vllm.vllm_adapter.config_hook import is_marked, mark_of
from peagle_vllm.vllm_adapter.scheduler_hook import DRAFT_DEPTH_ATTR, DRAFT_TIME_ATTR


def _wrap(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, device, *args, **kwargs):
        original(self, vllm_config, device, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is None or not is_marked(spec) or not hasattr(self, "drafter"):
            return
        from peagle_vllm.vllm_adapter.proposer import PEagleProposer
        from peagle_vllm.vllm_adapter.sampler import PEagleRejectionSampler

        self.drafter = PEagleProposer(vllm_config, device, self)
        registry = getattr(self, "jit_warmup_registry", None)
        with registry.activate() if registry is not None else contextlib.nullcontext():
            self.rejection_sampler = PEagleRejectionSampler(self.sampler, spec, device,
                                                            verify_mode=mark_of(spec)["options"]["verify"])

    __init__.__peagle_patched__ = True
    return __init__


def _wrap_update_states(original):
    @functools.wraps(original)
    def _update_states(self, scheduler_output):
        rollback_hook.apply_block_counts(self, scheduler_output)
        self.peagle_draft_depth = getattr(scheduler_output, DRAFT_DEPTH_ATTR, None)
        out = original(self, scheduler_output)
        mode = rollback_hook.poison_mode()
        if mode is not None:
            rollback_hook.poison_stale_kv(self, mode)
        return out

    return _update_states


def _wrap_input_fits(original):
    @functools.wraps(original)
    def _input_fits_in_drafter(self, *args, **kwargs):
        """Depth 0 (every request in fallback): vLLM's own no-draft path, which skips the drafter's
        input preparation as well as its forward."""
        return getattr(self, "peagle_draft_depth", None) != 0 and original(self, *args, **kwargs)

    return _input_fits_in_drafter


def _wrap_sample_tokens(original):
    @functools.wraps(original)
    def sample_tokens(self, *args, **kwargs):
        """Attaches (draft runs, seconds) finished since the last step to this step's output (an
        attribute: it survives the pickling to the scheduler; async outputs wrap theirs and go without)."""
        out = original(self, *args, **kwargs)
        timer = getattr(getattr(self, "drafter", None), "draft_timer", None)
        if timer is not None and isinstance(out, ModelRunnerOutput):
            runs, seconds = timer.take()
            if runs:  # a draft ran in this call, so `out` is this step's own output, not a shared constant
                setattr(out, DRAFT_TIME_ATTR, (runs, seconds))
        return out

    return sample_tokens


def patch() -> None:
    """Wraps GPUModelRunner.__init__, _update_states, sample_tokens and _input_fits_in_drafter once."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner.__init__, "__peagle_patched__", False):
        return
    GPUModelRunner.__init__ = _wrap(GPUModelRunner.__init__)
    GPUModelRunner._update_states = _wrap_update_states(GPUModelRunner._update_states)
    GPUModelRunner.sample_tokens = _wrap_sample_tokens(GPUModelRunner.sample_tokens)
    if hasattr(GPUModelRunner, "_input_fits_in_drafter"):  # else the proposer returns empty drafts itself
        GPUModelRunner._input_fits_in_drafter = _wrap_input_fits(GPUModelRunner._input_fits_in_drafter)
