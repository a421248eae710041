"""The only code that touches vLLM: one adapter per vLLM line (`v1/` for 0.32-0.33), chosen by the installed
vLLM's version. `install()` checks the version and installs that adapter, once per process."""

from __future__ import annotations


def install() -> None:
    from peagle_vllm.vllm_adapter import v1
    from peagle_vllm.vllm_adapter.version import check_vllm_version

    v1.install(check_vllm_version())
