"""The adapter for vLLM 0.32/0.33 (the V1 model runner): p_eagle rides on vLLM's eagle3 + parallel-drafting
scheduling, with our proposer, sampler, adaptive depth and metrics hooked in by the patch table
(`patches.PATCHES`)."""

from __future__ import annotations

_report: dict[str, str] | None = None


def install(vllm_version: str, table: tuple | None = None) -> dict[str, str]:
    """Registers the draft architecture and applies the patch table (`patches.PATCHES` unless another `table`
    is given, e.g. the profiler's timed one), once per process; returns what was patched and what was skipped."""
    global _report
    if _report is not None:
        return _report
    from vllm import ModelRegistry

    from peagle_vllm.vllm_adapter.v1.draft_model import ARCHITECTURE
    from peagle_vllm.vllm_adapter.v1.patches import PATCHES, apply_patches

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "peagle_vllm.vllm_adapter.v1.draft_model:PEagleDraftModel")
    _report = apply_patches(PATCHES if table is None else table, vllm_version)
    return _report
