"""Engine-core hooks on `vllm.v1.core.sched.scheduler.Scheduler` for adaptive depth.

- `__init__`: a p_eagle scheduler gets a DepthController (unless the config fixes K).
- `update_draft_token_ids`: each request's drafts are cut to the K the controller chooses, so the
  next step verifies only those (K=0: plain decoding for that request). Seeded requests keep K_max
  so that the same seed gives the same output.
- `update_from_output`: accepted counts per request and the step's time and token count feed the
  controller; finished requests are forgotten.
Synchronous scheduling only (vLLM's CPU backend); under async scheduling drafts reach the runner
directly and K stays fixed.
"""

from __future__ import annotations

import functools
import time

from peagle_vllm.depth import DepthController, DepthOptions
from peagle_vllm.vllm_adapter.config_hook import is_marked, mark_of

ATTR = "_peagle_depth"


def _wrap_init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is not None and is_marked(spec):
            opts = mark_of(spec)["options"]
            if opts.get("adaptive", True):
                ctrl = DepthController(DepthOptions(max_k=opts["num_speculative_tokens"], min_k=opts.get("min_k", 0)))
                setattr(self, ATTR, ctrl)
                self._peagle_last_step = None

    return __init__


def _wrap_update_drafts(original):
    @functools.wraps(original)
    def update_draft_token_ids(self, draft_token_ids):
        ctrl: DepthController | None = getattr(self, ATTR, None)
        if ctrl is not None and draft_token_ids.req_ids:
            ks = ctrl.choose(list(draft_token_ids.req_ids))
            draft_token_ids.draft_token_ids = [list(d) if self._peagle_seeded(rid) else list(d)[:k] for rid, d, k in
                                               zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids, ks)]
        return original(self, draft_token_ids)

    return update_draft_token_ids


def _is_seeded(self, req_id: str) -> bool:
    """Requests with a seed keep the full K: timing-driven depth would make their samples unrepeatable."""
    request = self.requests.get(req_id)
    params = getattr(request, "sampling_params", None)
    return params is not None and params.seed is not None


def _wrap_update_from_output(original):
    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output):
        ctrl: DepthController | None = getattr(self, ATTR, None)
        if ctrl is not None:
            now = time.perf_counter()
            if self._peagle_last_step is not None and scheduler_output.total_num_scheduled_tokens:
                ctrl.observe_step(scheduler_output.total_num_scheduled_tokens, now - self._peagle_last_step)
            self._peagle_last_step = now
            index = model_runner_output.req_id_to_index
            sampled = model_runner_output.sampled_token_ids
            for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
                i = index.get(req_id)
                if i is not None and i < len(sampled):
                    ctrl.observe(req_id, len(drafts), max(len(sampled[i]) - 1, 0))
            for req_id in scheduler_output.finished_req_ids:
                ctrl.forget(req_id)
        out = original(self, scheduler_output, model_runner_output)
        if ctrl is not None and not self.requests:
            self._peagle_last_step = None  # idle time between requests is no step cost
        return out

    return update_from_output


def patch() -> None:
    """Wraps the three Scheduler methods once."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler.__init__, "__peagle_patched__", False):
        return
    Scheduler._peagle_seeded = _is_seeded
    for name, wrap in (("__init__", _wrap_init), ("update_draft_token_ids", _wrap_update_drafts),
                       ("update_from_output", _wrap_update_from_output)):
        wrapped = wrap(getattr(Scheduler, name))
        wrapped.__peagle_patched__ = True
        setattr(Scheduler, name, wrapped)
