"""Prompt lookup beside the depth head, offline: the target's greedy outputs on the 64 held-out prompts (128
tokens, vLLM without speculation), the shipped depth head's 8 drafts at every position (transformers, the
trainer's layout with every slot kept), then steps replayed at K=4 and K=8: each step drafts from the head, from
prompt lookup (`peagle_vllm.lookup`) or a blend, and advances by its accepted drafts + 1. Acceptance per step is
what the engine's acceptance length measures. Run from the repository root:

    PYTHONPATH=. .venv/bin/python results/prompt-lookup-s60/lookup_offline.py [--build]

`--build` regenerates greedy_heads.json (some 4 min here); without it the committed one is read."""
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from peagle_vllm.lookup import PromptLookup

HERE = Path(__file__).resolve().parent
DATA = HERE / "greedy_heads.json"
K_HEAD = 8


def build() -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    from peagle_vllm.checkpoint import load_head
    from peagle_vllm.harness.prompts import EVAL_PROMPTS, chat_prompts, read_user_messages
    from peagle_vllm.harness.runs import close_llm, make_llm, quiet_vllm, set_cpu_defaults
    from peagle_vllm.train.data import capture
    from peagle_vllm.train.layout import build_layout
    from peagle_vllm.train.objective import head_inputs

    set_cpu_defaults(); quiet_vllm()
    target_dir = "models/SmolLM2-135M-Instruct"
    messages = read_user_messages(EVAL_PROMPTS)
    prompts = chat_prompts(target_dir, messages)
    llm = make_llm(target_dir, None, max_num_seqs=16)
    tok = llm.get_tokenizer()
    outs = llm.generate(prompts, SamplingParams(max_tokens=128, temperature=0), use_tqdm=False)
    rows = [{"message": m, "prompt_ids": tok(p, add_special_tokens=False).input_ids,
             "out_ids": list(o.outputs[0].token_ids)} for m, p, o in zip(messages, prompts, outs)]
    close_llm(llm)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = load_head(Path("models/smollm2-peagle-depth"), target_embeddings=target.get_input_embeddings().weight).eval()
    for r in rows:
        seq = torch.tensor([r["prompt_ids"] + r["out_ids"]])
        with torch.no_grad():
            aux, _ = capture(target, seq, head.cfg.aux_layer_ids)
            layout = build_layout(seq.shape[1], K_HEAD, r=1.0, r_min=1.0)
            slot_ids, hidden, positions = head_inputs(head, layout, seq, aux)
            normed, _ = head(slot_ids, hidden, positions, layout.attend.unsqueeze(0))
            drafts = head.draft_to_target()[head.draft_logits(normed).argmax(-1)][0]
        by_anchor = {}
        for a, d, t in zip(layout.anchor.tolist(), layout.depth.tolist(), drafts.tolist()):
            by_anchor.setdefault(a, {})[d] = t
        p0 = len(r["prompt_ids"])
        # step with prompt + out[:t] known: the head's drafts for out[t:] come from anchor p0 + t - 2
        r["head_drafts"] = [[by_anchor.get(p0 + t - 2, {}).get(d, -1) for d in range(K_HEAD)]
                            for t in range(1, len(r["out_ids"]))]
    DATA.write_text(json.dumps(rows))


def accepted(draft: list[int], out: list[int], t: int) -> int:
    n = 0
    for a, b in zip(draft, out[t:]):
        if a != b:
            break
        n += 1
    return n


def replay(rows: list[dict], k: int, policy) -> tuple[float, int]:
    """Mean tokens per step (accepted + 1) and steps, drafts chosen by `policy(head, lookup, n)`."""
    per_step = []
    for r in rows:
        out, t = r["out_ids"], 1
        while t < len(out):
            tokens = np.array(r["prompt_ids"] + out[:t])
            n = next((m for m in range(5, 0, -1) if len(PromptLookup(m, m).continuation(tokens, 1))), 0)
            found = PromptLookup(1, 5).continuation(tokens, k).tolist()
            draft = policy(r["head_drafts"][t - 1][:k], found, n)
            a = accepted(draft, out, t)
            per_step.append(a + 1)
            t += a + 1
    return statistics.mean(per_step), len(per_step)


POLICIES = {
    "head alone": lambda head, found, n: head,
    "lookup alone (n >= 1)": lambda head, found, n: found,
    "lookup where n >= 1, else head": lambda head, found, n: found + head[len(found):] if n >= 1 else head,
    "lookup where n >= 2, else head (the default)": lambda head, found, n: (
        found + head[len(found):] if n >= 2 else head),
    "lookup where n >= 3, else head": lambda head, found, n: found + head[len(found):] if n >= 3 else head,
    "lookup where n >= 2 or its first draft is the head's": lambda head, found, n: (
        found + head[len(found):] if n >= 2 or (found and found[0] == head[0]) else head),
}

if __name__ == "__main__":
    if "--build" in sys.argv or not DATA.exists():
        build()
    rows = json.loads(DATA.read_text())
    print(f"{len(rows)} prompts, {sum(len(r['out_ids']) for r in rows)} greedy tokens")
    print("| drafts | K=4: tokens per step | steps | K=8: tokens per step | steps |\n|---|---|---|---|---|")
    for name, policy in POLICIES.items():
        (a4, s4), (a8, s8) = replay(rows, 4, policy), replay(rows, 8, policy)
        print(f"| {name} | {a4:.3f} | {s4} | {a8:.3f} | {s8} |")
