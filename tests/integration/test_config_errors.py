"""Bad p_eagle configs fail before the engine starts, with one clear line naming the field and fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from peagle_vllm.checkpoint import CheckpointError
from peagle_vllm.config import PEagleConfigError
from peagle_vllm.harness.runs import make_llm


def _copy_head(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def _bad(tiny, tmp_path: Path, case: str) -> dict:
    spec = {"method": "p_eagle", "model": str(tiny["head"]), "num_speculative_tokens": 8}
    head = tmp_path / "head"
    if case == "no model":
        del spec["model"]
    elif case == "k zero":
        spec["num_speculative_tokens"] = 0
    elif case == "k above 32":
        spec["num_speculative_tokens"] = 33
    elif case == "missing path":
        spec["model"] = str(tmp_path / "does-not-exist")
    elif case == "other hidden size":
        _copy_head(tiny["head"], head)
        _edit_config(head, target_hidden_size=64)
        spec["model"] = str(head)
    elif case == "other vocabulary":
        _copy_head(tiny["head"], head)
        cfg = json.loads((head / "config.json").read_text())
        cfg["transformer_layer_config"]["vocab_size"] = 9999
        (head / "config.json").write_text(json.dumps(cfg))
        spec["model"] = str(head)
    elif case == "aux layers":
        _copy_head(tiny["head"], head)
        _edit_config(head, eagle_aux_hidden_state_layer_ids=[1, 2, 7])
        spec["model"] = str(head)
    elif case == "no mask token":
        _copy_head(tiny["head"], head)
        _edit_config(head, mask_token_id=None)
        spec["model"] = str(head)
    elif case == "no mask hidden":
        _copy_head(tiny["head"], head)
        weights = load_file(str(head / "model.safetensors"))
        del weights["mask_hidden"]
        save_file(weights, str(head / "model.safetensors"))
        spec["model"] = str(head)
    elif case == "unknown key":
        spec["num_specluative_tokens"] = 4
    elif case == "corpus of another vocabulary":
        (tmp_path / "answers.jsonl").write_text(json.dumps({"prompt_ids": [1], "response_ids": [10**6]}) + "\n")
        spec["lookup_corpus"] = str(tmp_path / "answers.jsonl")
    return spec


CASES = {
    "no model": "speculative_config['model'] is missing",
    "k zero": "speculative_config['num_speculative_tokens'] is 0",
    "k above 32": "speculative_config['num_speculative_tokens'] is 33",
    "missing path": "does not exist",
    "other hidden size": "does not match the target's hidden size",
    "other vocabulary": "does not match the target's vocabulary",
    "aux layers": "eagle_aux_hidden_state_layer_ids",
    "no mask token": "no mask token",
    "no mask hidden": "no 'mask_hidden' tensor",
    "unknown key": "speculative_config['num_specluative_tokens'] is not a speculative-config field",
    "corpus of another vocabulary": "speculative_config['lookup_corpus']: ",
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_error(tiny, tmp_path: Path, case: str) -> None:
    with pytest.raises((PEagleConfigError, CheckpointError)) as err:
        make_llm(str(tiny["target"]), _bad(tiny, tmp_path, case))
    assert CASES[case] in str(err.value) and "\n" not in str(err.value)


def test_depth_head_is_refused_by_vllms_builtin_parallel_drafting(tiny) -> None:
    with pytest.raises(PEagleConfigError, match="only \"method\": \"p_eagle\" runs it"):
        make_llm(str(tiny["target"]), {"method": "eagle3", "parallel_drafting": True, "model": str(tiny["depth"]),
                                       "num_speculative_tokens": 4})


def test_pipeline_parallelism_is_refused_at_startup(tiny) -> None:
    with pytest.raises(PEagleConfigError, match="pipeline parallelism"):
        make_llm(str(tiny["target"]), {"method": "p_eagle", "model": str(tiny["head"]), "num_speculative_tokens": 4},
                 pipeline_parallel_size=2)
