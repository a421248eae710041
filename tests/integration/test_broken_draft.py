"""A draft head that produces NaN/Inf degrades to rejected drafts: outputs stay those of plain decoding."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from peagle_vllm.harness.runs import generate


def _broken_copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(dst / "model.safetensors"))
    weights["lm_head.weight"] = torch.full_like(weights["lm_head.weight"], float("nan"))
    save_file(weights, str(dst / "model.safetensors"))
    return dst


def _bad_rows(worker) -> int:
    return worker.model_runner.drafter.num_bad_draft_rows


def test_nan_head_keeps_outputs_exact_greedy_and_sampled(tiny, tmp_path: Path) -> None:
    from peagle_vllm.harness.runs import close_llm, make_llm
    from vllm import SamplingParams

    head = _broken_copy(tiny["head"], tmp_path / "broken")
    prompts = ["def f1(x):\n", "x = 3\n", "class A:\n"]
    spec = {"method": "p_eagle", "model": str(head), "num_speculative_tokens": 4}
    base = generate(str(tiny["target"]), None, prompts, 32)
    ours = make_llm(str(tiny["target"]), spec)
    greedy = ours.generate(prompts, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in greedy] == base.token_ids
    sampled = ours.generate(prompts, SamplingParams(temperature=1.0, max_tokens=32, seed=1, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 32 for o in sampled)
    (bad,) = ours.collective_rpc(_bad_rows)
    close_llm(ours)
    assert bad > 0
