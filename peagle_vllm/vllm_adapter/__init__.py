"""The only code that touches vLLM internals. `install()` checks the vLLM version, registers the
draft architecture and applies each patch once (a second call is a no-op)."""

from __future__ import annotations

from peagle_vllm.vllm_adapter.version import check_vllm_version

# under vLLM's own logger, whose handler and level vLLM sets up in every process (engine core included):
# a logger of our own has no handler there, and its INFO lines (the depth log line) were never shown
LOGGER_NAME = "vllm.peagle_vllm"
_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    check_vllm_version()
    from vllm import ModelRegistry

    from peagle_vllm.vllm_adapter import config_hook, generator_hook, metrics_hook, runner_hook, scheduler_hook
    from peagle_vllm.vllm_adapter.draft_model import ARCHITECTURE

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "peagle_vllm.vllm_adapter.draft_model:PEagleDraftModel")
    config_hook.patch()
    runner_hook.patch()
    scheduler_hook.patch()
    metrics_hook.patch()
    generator_hook.patch()
    _installed = True
