"""Where a draft head lives: a local directory, or a Hugging Face repository id (`org/name`) fetched into the
hub cache as vLLM fetches its models (offline, only what the cache already holds)."""

from __future__ import annotations

import os
import re

from peagle_vllm.config import PEagleConfigError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_draft_path(model: str) -> str:
    """An absolute local directory for `model`; a repository id is downloaded (config and weights only)."""
    local = os.path.abspath(os.path.expanduser(model))
    if os.path.exists(local) or not REPO_ID.match(model):
        return local
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors"])
    except Exception as exc:  # network, authentication or offline-cache misses: one line with the fix
        raise PEagleConfigError(f"speculative_config['model'] {model!r} is neither a local directory nor a "
                                f"Hugging Face repository this machine can fetch ({type(exc).__name__}): download it "
                                f"(`huggingface-cli download {model} --local-dir DIR`) and pass DIR") from exc
