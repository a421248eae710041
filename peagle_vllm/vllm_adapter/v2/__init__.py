"""The adapter for vLLM 0.34 and later (the V2 model runner): p_eagle is a custom speculative method,
registered through vLLM's experimental custom-speculator API. No vLLM class is patched.

`install()` registers, once per process (vLLM calls our general plugin in every process):
- the config parser that reads P-EAGLE checkpoints (`hf_config.PEagleConfigParser`, format "peagle");
- the draft architecture (`hf_config.ARCHITECTURE` -> `draft_model.PEagleDraftModel`) in vLLM's ModelRegistry;
- the method: `register_speculative_method("p_eagle", "...v2.config.PEagleSpeculatorConfig")`, whose
  `speculator_class` is `speculator.PEagleSpeculator`.
A second call is a no-op. Use: `{"method": "p_eagle", "model": HEAD_DIR, "num_speculative_tokens": K,
"speculator_options": {"verify": "block"}}` (see docs/vllm-0.34.md).
"""

from __future__ import annotations

from peagle_vllm.config import METHOD

CONFIG_CLASS = "peagle_vllm.vllm_adapter.v2.config.PEagleSpeculatorConfig"
DRAFT_MODEL_CLASS = "peagle_vllm.vllm_adapter.v2.draft_model:PEagleDraftModel"
_installed = False


def install() -> None:
    """Registers p_eagle with this process's vLLM (0.34+); idempotent."""
    global _installed
    if _installed:
        return
    from vllm import ModelRegistry
    from vllm.transformers_utils.config import get_config_parser, register_config_parser
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    from peagle_vllm.vllm_adapter.v2.hf_config import ARCHITECTURE, CONFIG_FORMAT, PEagleConfigParser

    try:
        known = type(get_config_parser(CONFIG_FORMAT)) is PEagleConfigParser
    except ValueError:  # "Unknown config format"
        known = False
    if not known:
        register_config_parser(CONFIG_FORMAT)(PEagleConfigParser)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, DRAFT_MODEL_CLASS)
    register_speculative_method(METHOD, CONFIG_CLASS)  # the same name and class again is a no-op in vLLM
    _installed = True
