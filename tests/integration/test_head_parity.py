"""The serving head (vLLM layers, paged KV) drafts what the plain-torch head drafts on the same inputs, for a head of
one decoder layer and of two (the published P-EAGLE heads have four)."""

from __future__ import annotations

import pytest
import torch

from peagle_vllm.checkpoint import load_head
from peagle_vllm.harness.runs import close_llm, make_llm


def _last_drafts(worker) -> list[list[int]]:
    return worker.model_runner.drafter.last_drafts.tolist()


@pytest.mark.parametrize("head", ["depth", "two_layer"])
def test_vllm_head_matches_plain_torch_head(tiny, head) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    k, head_dir = 8, tiny[head]
    prompt = "def f12(x):\n    return x * 12"
    llm = make_llm(str(tiny["target"]), {"method": "p_eagle", "model": str(head_dir), "num_speculative_tokens": k})
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
