"""Self-distillation data: the target's own chat-template responses to the training prompts, generated
by vLLM in large batches and written chunk by chunk (`chunk-NNNN.jsonl`), so an interrupted run resumes
at the first missing chunk. Each row holds the token ids the trainer reads (`prompt_ids`,
`response_ids`); a share of the prompts is answered by sampling (temperature 1, top-p 0.9) so the head
also sees the contexts that sampled requests produce. Whole chunks are sampled or greedy: vLLM's CPU
sampler sorts the whole batch's logits as soon as one request asks for top-p, so mixing them in one
batch slows the greedy ones down too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

LOG = "distill_log.json"


def chunk_path(out: Path, index: int) -> Path:
    return out / f"chunk-{index:04d}.jsonl"


def distill(target: str, prompts: list[str], out: Path, max_tokens: int = 256, chunk: int = 512,
            sampled_every: int = 3, max_num_seqs: int = 256, log=print) -> dict:
    """Answers `prompts` with the target (chunk c is sampled when c % sampled_every == 0, else greedy);
    skips chunks already written. Returns the log: tokens, seconds, rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / LOG
    record = json.loads(log_path.read_text()) if log_path.exists() else {"tokens": 0, "seconds": 0.0, "rows": 0}
    todo = [i for i in range(0, len(prompts), chunk) if not chunk_path(out, i // chunk).exists()]
    if not todo:  # (before vLLM is imported: a finished data set needs none)
        log(f"self-distillation: all {len(prompts)} prompts answered in {out} (cached)")
        return record
    from tqdm import tqdm
    from vllm import SamplingParams

    from peagle_vllm.harness.runs import close_llm, make_llm, set_cpu_defaults

    set_cpu_defaults()
    llm = make_llm(target, None, max_model_len=1024, max_num_seqs=max_num_seqs)
    tokenizer = llm.get_tokenizer()
    bar = tqdm(total=len(prompts), initial=len(prompts) - sum(len(prompts[i:i + chunk]) for i in todo),
               desc="self-distillation", unit="prompt")
    try:
        for start in todo:
            batch = prompts[start:start + chunk]
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True) for p in batch]
            sampled = (start // chunk) % sampled_every == 0
            params = [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=max_tokens) if sampled
                      else SamplingParams(temperature=0.0, max_tokens=max_tokens)] * len(batch)
            t0 = time.time()
            outs = llm.generate(texts, params, use_tqdm=False)
            seconds = time.time() - t0
            rows = [{"prompt": p, "temperature": sp.temperature, "prompt_ids": list(o.prompt_token_ids),
                     "response_ids": list(o.outputs[0].token_ids), "finished": o.outputs[0].finish_reason == "stop"}
                    for p, sp, o in zip(batch, params, outs)]
            tmp = chunk_path(out, start // chunk).with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            tmp.replace(chunk_path(out, start // chunk))
            record["tokens"] += sum(len(r["response_ids"]) for r in rows)
            record["seconds"] += seconds
            record["rows"] += len(rows)
            log_path.write_text(json.dumps(record, indent=1))
            bar.update(len(batch))
            bar.set_postfix(tokens=record["tokens"], tok_s=f"{record['tokens'] / record['seconds']:.0f}")
    finally:
        bar.close()
        close_llm(llm)
    return record
