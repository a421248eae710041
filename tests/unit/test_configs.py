"""Every file in configs/ is a valid speculative config; those naming a shipped head fit its shipped target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peagle_vllm.checkpoint import read_head_config, read_tensors, validate_weights
from peagle_vllm.config import check_head_fits_target, split_p_eagle_config
from peagle_vllm.corpus_lookup import read_answers

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.json"))
TARGETS = {"smollm2-135m": REPO / "models" / "SmolLM2-135M-Instruct", "demo-target": REPO / "models" / "demo-target"}
VLLM_KEYS = {"model", "num_speculative_tokens", "method", "parallel_drafting"}  # all the files use of vLLM's own


def test_there_is_a_config_for_each_shipped_head_and_each_published_format() -> None:
    names = {p.name for p in CONFIGS}
    assert {"smollm2-135m-p_eagle.json", "smollm2-135m-vllm-parallel.json", "smollm2-135m-vllm-eagle3.json",
            "gpt-oss-20b-p_eagle.json", "gpt-oss-120b-p_eagle.json", "qwen3-8b-p_eagle.json",
            "qwen3-coder-30b-a3b-p_eagle.json"} <= names
    assert (REPO / "configs" / "README.md").read_text().count(".json`") == len(CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_valid_and_its_local_head_fits_its_target(path: Path) -> None:
    spec = json.loads(path.read_text())
    if "lookup_corpus" in spec:  # a path from the repository's root, as "model"
        spec["lookup_corpus"] = str(REPO / spec["lookup_corpus"])
    if spec["method"] == "p_eagle":
        options, passthrough = split_p_eagle_config(spec, VLLM_KEYS)
        assert "method" not in passthrough
    else:
        assert spec["method"] == "eagle3" and set(spec) <= VLLM_KEYS
    model = REPO / spec["model"]
    target = next((t for prefix, t in TARGETS.items() if path.name.startswith(prefix)), None)
    if target is None:  # a published head on the hub: its format is what checkpoint.py reads (tested there)
        assert "/" in spec["model"] and not model.exists()
        return
    head = read_head_config(model)
    validate_weights(head, read_tensors(model, ("mask_hidden", "d2t")), str(model))
    if not (target / "config.json").is_file():
        pytest.skip(f"{target.name} is not converted here (bash scripts/setup.sh makes it)")
    cfg = json.loads((target / "config.json").read_text())
    k = spec.get("num_speculative_tokens") or head.trained_depth
    if spec["method"] == "p_eagle":
        check_head_fits_target(head, str(model), cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], k)
        if "lookup_corpus" in spec:
            read_answers(Path(spec["lookup_corpus"]), cfg["vocab_size"])
    else:
        assert head.target_hidden_size == cfg["hidden_size"] and head.vocab_size == cfg["vocab_size"]
        assert head.variant == ("eagle3" if not spec.get("parallel_drafting") else "standard")
