"""The only code that touches vLLM: one adapter per vLLM line (`v1/` for 0.32-0.33, `v2/` for 0.34 and later),
chosen by the installed vLLM's version. `install()` installs that adapter, once per process."""

from __future__ import annotations


def install() -> None:
    from peagle_vllm.vllm_adapter.version import adapter_line, installed_vllm_version

    version = installed_vllm_version()
    if adapter_line(version) == "v1":
        from peagle_vllm.vllm_adapter import v1

        v1.install(version)
    else:
        from peagle_vllm.vllm_adapter import v2

        v2.install()
