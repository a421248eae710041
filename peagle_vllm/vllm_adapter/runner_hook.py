"""Worker-side hook on `vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__` (the CPU runner
reaches it through super()): for a p_eagle config, the drafter becomes PEagleProposer and the
rejection sampler PEagleRejectionSampler. The drafter loads its weights later, in load_model.
"""

from __future__ import annotations

import contextlib
import functools

from peagle_vllm.vllm_adapter.config_hook import is_marked, mark_of


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


def patch() -> None:
    """Wraps GPUModelRunner.__init__ once."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner.__init__, "__peagle_patched__", False):
        return
    GPUModelRunner.__init__ = _wrap(GPUModelRunner.__init__)
