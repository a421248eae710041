"""p_eagle is a registered custom speculative method of the real vLLM 0.34 after `v2.install()`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


def test_install_registers_method_parser_and_architecture(installed) -> None:
    from vllm import ModelRegistry
    from vllm.transformers_utils.config import get_config_parser
    from vllm.v1.worker.gpu.spec_decode.speculator_config import (get_custom_speculator_config_class,
                                                                   registered_speculative_methods)

    from peagle_vllm.vllm_adapter.v2.config import PEagleSpeculatorConfig
    from peagle_vllm.vllm_adapter.v2.hf_config import ARCHITECTURE, CONFIG_FORMAT, PEagleConfigParser

    assert "p_eagle" in registered_speculative_methods()
    assert get_custom_speculator_config_class("p_eagle") is PEagleSpeculatorConfig
    assert isinstance(get_config_parser(CONFIG_FORMAT), PEagleConfigParser)
    assert ARCHITECTURE in ModelRegistry.get_supported_archs()


def test_second_install_is_a_no_op(installed) -> None:
    from vllm.v1.worker.gpu.spec_decode import speculator_config as sc

    from peagle_vllm.vllm_adapter import v2

    before = dict(sc._CUSTOM_CONFIGS)
    v2._installed = False  # force the registrations to run again: vLLM accepts the same ones silently
    v2.install()
    v2.install()
    assert dict(sc._CUSTOM_CONFIGS) == before


def test_speculator_class_resolves_to_a_v2_draft_model_speculator(make_spec) -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    spec = make_spec()
    cls = resolve_obj_by_qualname(spec.speculator_config.speculator_class)
    assert issubclass(cls, DraftModelSpeculator) and cls.__name__ == "PEagleSpeculator"


def test_version_tells_the_adapter_line() -> None:
    from peagle_vllm.vllm_adapter.version import UnsupportedVLLMError, adapter_line

    assert adapter_line("0.32.1") == adapter_line("0.33.0") == "v1"
    assert adapter_line("0.34.0") == adapter_line("0.35.2") == adapter_line("1.0.0") == "v2"
    with pytest.raises(UnsupportedVLLMError):
        adapter_line("0.31.0")


def test_plugin_entry_point_registers_in_a_fresh_process() -> None:
    """vLLM runs general plugins in every process; the plugin must end in v2.install() on 0.34."""
    code = ("from peagle_vllm.plugin import register; register()\n"
            "from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods\n"
            "print('methods', registered_speculative_methods())")
    env = {k: v for k, v in os.environ.items() if k != "PEAGLE_VLLM_DISABLE"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "'p_eagle'" in run.stdout
