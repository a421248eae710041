"""The serving head (vLLM layers, paged KV) drafts what the plain-torch head drafts on the same inputs, for a head of
one decoder layer and of two (the published P-EAGLE heads have four), with its matmuls in the model's dtype; by
default, on a CPU with bfloat16 matmuls, they run in bfloat16 and the output stays the plain engine's."""

from __future__ import annotations

import pytest
import torch

from peagle_vllm.checkpoint import load_head
from peagle_vllm.harness.runs import close_llm, make_llm
from peagle_vllm.matmul_dtype import cpu_has_bf16_matmuls


def _last_drafts(worker) -> list[list[int]]:
    return worker.model_runner.drafter.last_drafts.tolist()


@pytest.mark.parametrize("head", ["depth", "two_layer"])
def test_vllm_head_matches_plain_torch_head(tiny, head) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    k, head_dir = 8, tiny[head]
    prompt = "def f12(x):\n    return x * 12"
    llm = make_llm(str(tiny["target"]), {"method": "p_eagle", "model": str(head_dir), "num_speculative_tokens": k,
                                         "head_matmul_dtype": "model"})
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)  # prefill + first proposal
    (served,), = llm.collective_rpc(_last_drafts)
    close_llm(llm)

    ids = AutoTokenizer.from_pretrained(tiny["target"])(prompt, return_tensors="pt").input_ids
    target = AutoModelForCausalLM.from_pretrained(tiny["target"], dtype=torch.float32).eval()
    head = load_head(head_dir).eval()
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i] for i in head.cfg.aux_layer_ids], dim=-1)
        next_token = out.logits[:, -1].argmax(-1)
        plain = head.draft_block(next_token, aux[:, -1], ids[:, 1:], aux[:, :-1], k)
    assert served == plain[0].tolist()


def _matmul_dtypes(worker) -> list[str]:
    model = worker.model_runner.drafter.model
    return [str(model.matmul_dtype), str(model.lm_head.weight.dtype), str(model.model.layers[0].matmul_dtype)]


@pytest.mark.skipif(not cpu_has_bf16_matmuls(), reason="this CPU has no bfloat16 matmul instructions")
def test_head_matmuls_run_in_bfloat16_by_default_on_this_cpu_and_output_is_unchanged(tiny) -> None:
    from vllm import SamplingParams

    prompts = ["def f12(x):\n    return x * 12", "import os\nimport sys\n"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    spec = {"method": "p_eagle", "model": str(tiny["depth"]), "num_speculative_tokens": 8}
    outputs, dtypes = [], []
    for config in (None, spec, {**spec, "head_matmul_dtype": "model"}):
        llm = make_llm(str(tiny["target"]), config)
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        if config is not None:
            (found,) = llm.collective_rpc(_matmul_dtypes)
            dtypes.append(found)
        close_llm(llm)
    assert dtypes == [["torch.bfloat16"] * 3, ["torch.float32"] * 3]
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]
