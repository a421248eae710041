"""`peagle-vllm demo`: the target with and without p_eagle on held-out prompts, one request at a time (the
latency case) and several at once; tokens/s, speedup, mean latency per request, acceptance and whether the
greedy outputs are identical. Each concurrency's two engines are built side by side and measured back to
back, so a slow spell of the machine weighs on both. On a shipped target with a corpus of its answers, the
head drafts with prompt and corpus lookup beside it unless told otherwise (`demo_lookups`)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from peagle_vllm.config import PEagleConfigError, split_p_eagle_config
from peagle_vllm.harness.real_target import CORPORA
from peagle_vllm.harness.runs import (close_llm, engines_are_eager, lookup_draft_tokens, make_llm, request_spec_figures,
                                      spec_figures)

WARMUP_TOKENS = 16
PROMPT_LOOKUP_MAX = 5  # n-grams up to 5 tokens, as in the shipped lookup configs


@dataclass
class Side:
    """One engine's run of a cell."""

    token_ids: list[list[int]]
    seconds: float
    latencies: list[float]  # per request: its first schedule to its last token, seconds

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.token_ids)) / self.seconds


@dataclass
class Cell:
    concurrency: int
    requests: int
    plain: Side
    spec: Side
    acceptance_length: float
    per_position: list[float]
    steps_verified: int  # engine steps (per request) that verified drafts; 0: adaptive depth never drafted
    lookup_share: float | None  # of the drafts verified, the share the lookups gave; None: lookups off

    def to_dict(self) -> dict:
        return {"requests": self.requests,
                "tokens_per_s": {"no_spec": round(self.plain.tokens_per_s, 1), "p_eagle": round(self.spec.tokens_per_s, 1)},
                "speedup": round(self.spec.tokens_per_s / self.plain.tokens_per_s, 3),
                "mean_latency_s": {"no_spec": round(statistics.mean(self.plain.latencies), 3),
                                   "p_eagle": round(statistics.mean(self.spec.latencies), 3)},
                "acceptance_length": round(self.acceptance_length, 3), "per_position_acceptance": self.per_position,
                "steps_verified": self.steps_verified, "drafting": self.steps_verified > 0,
                "lookup_draft_share": None if self.lookup_share is None else round(self.lookup_share, 3),
                "greedy_identical": self.plain.token_ids == self.spec.token_ids}


def _run(llm, prompts: list[str], max_tokens: int) -> tuple[Side, list]:
    from vllm import SamplingParams

    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - t0
    latencies = [o.metrics.last_token_ts - o.metrics.scheduled_ts if o.metrics is not None else seconds for o in outs]
    return Side([list(o.outputs[0].token_ids) for o in outs], seconds, latencies), outs


def run_cell(target: str, spec: dict, prompts: list[str], concurrency: int, max_tokens: int) -> Cell:
    """All `prompts` to an engine that runs `concurrency` of them at once, without and with p_eagle."""
    engines = [make_llm(target, None, max_num_seqs=concurrency, enable_prefix_caching=False),
               make_llm(target, spec, max_num_seqs=concurrency, enable_prefix_caching=False,
                        per_request_spec_decode_metrics="summary")]
    looks_up = bool(spec.get("prompt_lookup_max") or spec.get("lookup_corpus"))
    try:
        for llm in engines:
            _run(llm, prompts[:2], WARMUP_TOKENS)
        plain, _ = _run(engines[0], prompts, max_tokens)
        before = spec_figures(engines[1]).draft_tokens, lookup_draft_tokens(engines[1])
        ours, outs = _run(engines[1], prompts, max_tokens)
        verified = spec_figures(engines[1]).draft_tokens - before[0]
        by_lookup = lookup_draft_tokens(engines[1]) - before[1]
    finally:
        for llm in engines:
            close_llm(llm)
    figures = request_spec_figures(outs)
    return Cell(concurrency, len(prompts), plain, ours, figures.acceptance_length, figures.per_position_rate,
                figures.drafts, by_lookup / verified if looks_up and verified else None)


def demo_lookups(target: Path, prompt_lookup_max: int | None, lookup_corpus: str | None,
                 head_only: bool) -> tuple[int | None, str | None]:
    """(prompt_lookup_max, lookup_corpus) beside the head: those the flags name; where they name none, a shipped
    target's own (prompt lookup and the answers it wrote, `CORPORA`) unless `head_only`; other targets: none.
    `head_only` with a lookup named is a PEagleConfigError."""
    if head_only and (prompt_lookup_max is not None or lookup_corpus is not None):
        raise PEagleConfigError("--head-only runs no lookup: drop it, or drop --prompt-lookup and --lookup-corpus")
    if head_only or prompt_lookup_max is not None or lookup_corpus is not None:
        return prompt_lookup_max, lookup_corpus
    corpus = CORPORA.get(target.name)
    return (PROMPT_LOOKUP_MAX, str(corpus)) if corpus is not None else (None, None)


def demo_spec(draft: Path, k: int, adaptive: bool, prompt_lookup_max: int | None = None,
              lookup_corpus: str | None = None, head_depth: int | None = None) -> dict:
    """The demo's p_eagle config, validated: a bad value is a PEagleConfigError naming the field and the demo's
    flags. `prompt_lookup_max`, `lookup_corpus`: prompt and corpus lookup beside the head (`peagle_vllm.lookup`,
    `peagle_vllm.corpus_lookup`), None: off; `head_depth`: the head drafts at most this deep, lookups past it
    (None: all K)."""
    spec = {"method": "p_eagle", "model": str(draft), "num_speculative_tokens": k, "adaptive": adaptive}
    for key, value in (("prompt_lookup_max", prompt_lookup_max), ("lookup_corpus", lookup_corpus),
                       ("head_depth", head_depth)):
        if value is not None:
            spec[key] = value
    try:
        split_p_eagle_config(spec)
    except PEagleConfigError as exc:  # the config's fields are the demo's flags
        flags = "--k, --prompt-lookup, --lookup-corpus, --head-depth, --head-only"
        raise PEagleConfigError(f"{exc} (set by {flags})") from exc
    return spec


def run_demo(target: Path, spec: dict, prompts: list[str], max_tokens: int, concurrencies: list[int],
             log=print) -> dict:
    """The report of `spec` (`demo_spec`) on `target`: top-level figures are those of the first concurrency (1 by
    default), `by_concurrency` has all."""
    cells = {}
    for c in concurrencies:
        requests = (prompts * (2 * c // len(prompts) + 1))[:max(len(prompts), 2 * c)] if c > 1 else prompts
        log(f"concurrency {c}: {len(requests)} requests, no speculation and p_eagle ...")
        cells[c] = run_cell(str(target), spec, requests, c, max_tokens).to_dict()
    first = cells[concurrencies[0]]
    return {"target": str(target), "draft": spec["model"], "k": spec["num_speculative_tokens"],
            "adaptive": spec["adaptive"], "prompt_lookup_max": spec.get("prompt_lookup_max"),
            "lookup_corpus": spec.get("lookup_corpus"), "head_depth": spec.get("head_depth"), "max_tokens": max_tokens,
            "prompts": len(prompts), "target_compiled": not engines_are_eager(), **{key: first[key] for key in (
                "speedup", "acceptance_length", "greedy_identical", "per_position_acceptance", "tokens_per_s",
                "mean_latency_s", "drafting", "lookup_draft_share")},
            "by_concurrency": {str(c): cell for c, cell in cells.items()}}


def render(report: dict) -> str:
    """The demo's screen."""
    mode = "adaptive depth" if report["adaptive"] else "fixed K"
    if report.get("prompt_lookup_max"):
        mode += f", prompt lookup of n-grams up to {report['prompt_lookup_max']}"
    if report.get("lookup_corpus"):
        mode += f", corpus lookup from {report['lookup_corpus']}"
    if report.get("head_depth"):
        mode += f", the head's drafts at the first {report['head_depth']} depths only"
    lines = [f"target {report['target']}", f"draft  {report['draft']}  (K={report['k']}, {mode})",
             f"{report['prompts']} held-out prompts, up to {report['max_tokens']} greedy tokens each; the target "
             + ("compiled" if report.get("target_compiled") else "run eagerly (--compiled: as vLLM runs it)"), ""]
    for c, cell in report["by_concurrency"].items():
        tps, lat = cell["tokens_per_s"], cell["mean_latency_s"]
        lines.append(f"{'one request at a time' if c == '1' else f'{c} requests at once'} ({cell['requests']} requests)")
        lines.append(f"  no speculation : {tps['no_spec']:8.1f} tokens/s   mean latency {lat['no_spec']:6.2f} s")
        lines.append(f"  p_eagle        : {tps['p_eagle']:8.1f} tokens/s   mean latency {lat['p_eagle']:6.2f} s   "
                     f"speedup {cell['speedup']:.2f}x")
        if cell["drafting"]:
            lines.append(f"  acceptance length {cell['acceptance_length']:.2f} tokens per step; per-position "
                         "acceptance " + " ".join(f"{r:.2f}" for r in cell["per_position_acceptance"]))
        else:
            lines.append("  no drafts were verified: adaptive depth measured speculation slower here and ran every "
                         "step as plain decoding")
        if cell["drafting"] and cell.get("lookup_draft_share") is not None:
            lines.append(f"  drafts verified: {100 * cell['lookup_draft_share']:.0f}% from the lookups, the rest from "
                         "the head")
        lines.append(f"  greedy outputs identical: {'yes' if cell['greedy_identical'] else 'NO'}")
    return "\n".join(lines)
