"""`peagle-vllm calibrate-draft`: a P-EAGLE head's draft temperature (`peagle_vllm.draft_temperature`), from the
head's logits and the target's logits at the drafts' positions, recorded in vLLM (one request at a time, fixed K,
T=1 and the top-p calibrated for, drafts at the head's own logits) on prompts of a training source that no head
trained on, never the evaluation set's; `--write` stores the best factor in the head's config.json, where vLLM's
p_eagle reads it."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch and the checkpoint code are imported where used: the CLI reads the defaults below when it starts.
# What a calibration records by default (`peagle-vllm calibrate-draft`, scripts/build_smollm2_heads.py).
PROMPTS, SOURCE, K, MAX_TOKENS, TOP_P = 32, "questions", 3, 128, 0.9
# Each source's prompts are taken from this index on: past every data set made from it (the build script's DATASETS
# and SHELVED).
FIRST_UNTRAINED = {"templates": 21504, "requests": 6144, "questions": 3072}


def calibration_prompts(target: str | Path, count: int = PROMPTS, source: str = SOURCE, seed: int = 0) -> list[str]:
    """`count` prompts of a training source from its FIRST_UNTRAINED index on, through the target's chat template
    (never held-out ones)."""
    from peagle_vllm.harness.prompts import chat_prompts
    from peagle_vllm.train.prompts import training_prompts

    start = FIRST_UNTRAINED[source]
    return chat_prompts(target, training_prompts(start, start + count, seed=seed, source=source))


class NothingRecorded(RuntimeError):
    """No step verified all K drafts: nothing to calibrate from."""


@contextlib.contextmanager
def _recording(pairs: list[tuple[torch.Tensor, torch.Tensor]]):
    """While open, each verification of one request's drafts appends (draft logits [K, Vd], target logits [K, V]),
    both float16: the head's logits of the latest drafts, and the target's rows that verify them."""
    import torch

    from peagle_vllm.vllm_adapter.v1 import proposer, sampler

    draw, verify = proposer.sample_drafts, sampler.PEagleRejectionSampler.forward
    latest: list[tuple[torch.Tensor, torch.Tensor]] = []

    def sample_drafts(logits, *args, **kwargs):  # logits [1, K, Vd]
        drafts, q = draw(logits, *args, **kwargs)
        latest[:] = [(logits[0].to(torch.float16), drafts[0])]
        return drafts, q

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        drafted = metadata.draft_token_ids.long()
        if latest and metadata.max_spec_len and torch.equal(drafted, latest[0][1][: drafted.numel()].long()):
            k = drafted.numel()
            pairs.append((latest[0][0][:k], logits[metadata.target_logits_indices].to(torch.float16)))
        return verify(self, metadata, draft_probs, logits, sampling_metadata)

    proposer.sample_drafts, sampler.PEagleRejectionSampler.forward = sample_drafts, forward
    try:
        yield
    finally:
        proposer.sample_drafts, sampler.PEagleRejectionSampler.forward = draw, verify


def record(target: str, draft: str, prompts: list[str], k: int, max_tokens: int,
           top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits [N, K, V], draft logits [N, K, Vd]) of the N steps that verified all K drafts."""
    import torch
    from vllm import SamplingParams

    from peagle_vllm.harness.runs import close_llm, make_llm

    spec = {"method": "p_eagle", "model": draft, "num_speculative_tokens": k, "adaptive": False,
            "draft_temperature": 1.0}
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    with _recording(pairs):
        llm = make_llm(target, spec, max_num_seqs=1, enable_prefix_caching=False)
        try:
            params = SamplingParams(temperature=1.0, top_p=top_p, max_tokens=max_tokens, seed=0)
            llm.generate(prompts, params, use_tqdm=False)
        finally:
            close_llm(llm)
    full = [(d, t) for d, t in pairs if d.shape[0] == k]
    if not full:
        raise NothingRecorded(f"no step verified all {k} drafts: give more --prompts or --max-tokens, or a lower --k")
    return torch.stack([t for _, t in full]), torch.stack([d for d, _ in full])


def draft_ids(draft: str) -> torch.Tensor | None:
    """[Vd] target id of each draft id, or None when the head drafts over the target's vocabulary."""
    import torch

    from peagle_vllm.checkpoint import read_tensors

    d2t = read_tensors(draft, ("d2t",)).get("d2t")
    return None if d2t is None else torch.arange(d2t.shape[0]) + d2t.long()


def write(draft: str, factor: float) -> Path:
    """Stores `factor` in the head's config.json (removes the key at 1); written to a temporary file, then renamed."""
    from peagle_vllm.checkpoint import DRAFT_TEMPERATURE_KEY

    path = Path(draft) / "config.json"
    raw = json.loads(path.read_text())
    raw.pop(DRAFT_TEMPERATURE_KEY, None)
    if factor != 1.0:
        raw[DRAFT_TEMPERATURE_KEY] = factor
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def run(target: str, draft: str, prompts: list[str], k: int = K, max_tokens: int = MAX_TOKENS,
        top_p: float = TOP_P) -> dict:
    """The report: each factor's expected accepted drafts per step, the best, and the steps measured."""
    from peagle_vllm.draft_temperature import calibrate

    target_logits, draft_logits = record(target, draft, prompts, k, max_tokens, top_p)
    best, scores = calibrate(target_logits, draft_logits, draft_ids(draft), top_p)
    return {"draft": draft, "k": k, "top_p": top_p, "prompts": len(prompts), "steps": int(target_logits.shape[0]),
            "draft_temperature": best, "expected_accepted": {str(s): round(v, 4) for s, v in scores.items()}}


def render(report: dict) -> str:
    """calibrate-draft's screen: expected accepted drafts per step by draft temperature, and the best."""
    scores = report["expected_accepted"]
    cells = [f"{s:>4}: {v:.3f}" for s, v in scores.items()]
    lines = [f"{report['steps']} steps; expected accepted drafts per step, by draft temperature:"]
    lines += ["  " + "   ".join(cells[row:row + 9]) for row in range(0, len(cells), 9)]
    best = report["draft_temperature"]
    lines.append(f"best: {best} ({scores[str(best)]:.3f} drafts against {scores['1.0']:.3f} at 1.0)"
                 + (f"; written to {report['written']}" if "written" in report
                    else "; --write stores it in the head's config.json"))
    return "\n".join(lines)
