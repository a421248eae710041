"""The one list of what p_eagle changes in vLLM 0.32/0.33 (the V1 runner line), and how it is applied.

Each `Patch` names an attribute of a vLLM class or module and the wrapper that replaces it (the wrapper
gets vLLM's original and calls it). `apply_patches` applies the table once per process and records each
original on its owner (`PATCHED_ATTR`): a second patch of the same attribute, or a required target the
running vLLM lacks, raises `PatchError` naming the vLLM version. Optional patches whose target is absent,
or whose condition does not hold, are skipped and reported as such. Besides this table, the adapter
registers its draft architecture with vLLM's ModelRegistry, and each p_eagle Scheduler wraps its own
KV manager's `allocate_slots` (an instance, not a class: `rollback_hook.reserve_own_lookahead`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from peagle_vllm.vllm_adapter.v1 import (config_hook, generator_hook, metrics_hook, runner_hook,
                                         scheduler_hook)

PATCHED_ATTR = "__peagle_patched__"  # on a patched class or module: {attribute: vLLM's original}

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"


class PatchError(RuntimeError):
    """vLLM cannot be patched as the table says; the message names the target and the vLLM version."""


@dataclass(frozen=True)
class Patch:
    owner: str  # "module:Class", or "module" for a module-level function
    attribute: str
    wrap: Callable[[Callable], Callable]  # vLLM's original -> its replacement
    why: str  # what p_eagle does there, in a line
    required: bool = True
    only_on_cpu: bool = False


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


PATCHES: tuple[Patch, ...] = (
    Patch("vllm.engine.arg_utils:EngineArgs", "create_speculative_config", config_hook.wrap_create_speculative_config,
          "p_eagle validated, translated to eagle3 + parallel drafting, the draft config marked"),
    Patch(RUNNER, "__init__", runner_hook.wrap_init, "our proposer and rejection sampler on a marked runner"),
    Patch(RUNNER, "_update_states", runner_hook.wrap_update_states,
          "released blocks cut from the worker's tables; the step's draft depth kept; stale-KV poison (tests)"),
    Patch(RUNNER, "execute_model", runner_hook.wrap_execute_model, "a step in fallback runs vLLM's plain path"),
    Patch(RUNNER, "sample_tokens", runner_hook.wrap_sample_tokens,
          "draft time onto the step's output; plain sampling in fallback; CPU generators restored"),
    Patch(RUNNER, "_get_spec_decode_draft_probs", runner_hook.wrap_get_spec_decode_draft_probs,
          "the sampler's q laid out from the drafts verified, one-hot where a lookup drafted"),
    Patch(RUNNER, "_input_fits_in_drafter", runner_hook.wrap_input_fits_in_drafter,
          "depth 0 skips the drafter's input preparation", required=False),
    Patch(RUNNER, "_sample", generator_hook.wrap_sample, "seeded CPU generators saved before sampling",
          required=False, only_on_cpu=True),
    Patch(RUNNER, "_bookkeeping_sync", generator_hook.wrap_bookkeeping_sync,
          "vLLM's CUDA-only generator rewind skipped for them", required=False, only_on_cpu=True),
    Patch(SCHEDULER, "__init__", scheduler_hook.wrap_init, "a p_eagle scheduler gets its state and controller"),
    Patch(SCHEDULER, "schedule", scheduler_hook.wrap_schedule,
          "the head's catch-up; per-request lookahead; draft depth and block counts to the worker"),
    Patch(SCHEDULER, "update_draft_token_ids", scheduler_hook.wrap_update_draft_token_ids,
          "drafts cut to the chosen K; surplus blocks released"),
    Patch(SCHEDULER, "update_from_output", scheduler_hook.wrap_update_from_output,
          "the step observed by adaptive depth; steady fallback held"),
    Patch(SCHEDULER, "make_stats", scheduler_hook.wrap_make_stats, "engine figures ride to the front end"),
    Patch("vllm.v1.engine.core:EngineCore", "post_step", scheduler_hook.wrap_post_step,
          "no draft-token round trip after a step without a draft"),
    Patch("vllm.v1.spec_decode.metrics:SpecDecodingProm", "__init__", metrics_hook.wrap_prom_init,
          "peagle: Prometheus series beside vLLM's"),
    Patch("vllm.v1.spec_decode.metrics:SpecDecodingProm", "observe", metrics_hook.wrap_prom_observe,
          "peagle: series fed from the same per-step stats"),
    Patch("vllm.v1.metrics.loggers:LoggingStatLogger", "__init__", metrics_hook.wrap_logging_init,
          "an acceptance window for the periodic log line"),
    Patch("vllm.v1.spec_decode.metrics:SpecDecodingLogging", "observe", metrics_hook.wrap_logging_observe,
          "the window fed per step"),
    Patch("vllm.v1.spec_decode.metrics:SpecDecodingLogging", "log", metrics_hook.wrap_log,
          "the `p_eagle metrics:` log line"),
    Patch("vllm.v1.metrics.loggers:StatLoggerManager", "record", metrics_hook.wrap_record,
          "engine figures taken out of SchedulerStats before vLLM's loggers"),
    Patch("vllm.v1.engine.llm_engine", "get_metrics_snapshot", metrics_hook.wrap_get_metrics_snapshot,
          "peagle: series in LLM.get_metrics()"),
)


def resolve(owner: str):
    """The class or module `owner` names; None when the running vLLM lacks it."""
    module_name, _, class_name = owner.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, class_name, None) if class_name else module


def apply_patches(patches: tuple[Patch, ...], vllm_version: str) -> dict[str, str]:
    """Applies `patches`; returns {"owner.attribute": "patched" | "skipped: why"}."""
    report = {}
    for patch in patches:
        name = f"{patch.owner}.{patch.attribute}"
        if patch.only_on_cpu and not _on_cpu():
            report[name] = "skipped: not on vLLM's CPU platform"
            continue
        owner = resolve(patch.owner)
        if owner is None or not hasattr(owner, patch.attribute):
            if patch.required:
                raise PatchError(f"vLLM {vllm_version} has no {name}, which p_eagle patches: install a supported "
                                 "vLLM (see README) or set PEAGLE_VLLM_DISABLE=1")
            report[name] = "skipped: absent in this vLLM"
            continue
        done = vars(owner).get(PATCHED_ATTR)
        if done is None:
            done = {}
            setattr(owner, PATCHED_ATTR, done)
        if patch.attribute in done:
            raise PatchError(f"{name} is already patched by p_eagle (vLLM {vllm_version}): a patch table must "
                             "name each attribute once")
        original = getattr(owner, patch.attribute)
        setattr(owner, patch.attribute, patch.wrap(original))
        done[patch.attribute] = original
        report[name] = "patched"
    return report
