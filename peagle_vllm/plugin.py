"""vLLM general-plugin entry point: `register()` runs once in every vLLM process (API server,
engine core, workers). It is idempotent and cheap; PEAGLE_VLLM_DISABLE=1 switches the plugin off.
"""

from __future__ import annotations

import os

DISABLE_ENV = "PEAGLE_VLLM_DISABLE"
TRACE_ENV = "PEAGLE_VLLM_TRACE_FILE"  # when set, each process that registers appends "pid argv0"


def register() -> None:
    """Installs the p_eagle method into this process's vLLM."""
    if os.environ.get(DISABLE_ENV) == "1":
        return
    from peagle_vllm.vllm_adapter import install

    install()
    trace = os.environ.get(TRACE_ENV)
    if trace:
        import sys

        with open(trace, "a") as fh:
            fh.write(f"{os.getpid()} {os.path.basename(sys.argv[0]) if sys.argv else '?'}\n")
