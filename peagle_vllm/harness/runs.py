"""Offline vLLM runs shared by the demo, eval-acceptance, benchmarks and tests: an engine with fast
CPU settings, timed greedy generation, and spec-decode figures read from vLLM's own counters."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

CPU_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in this process: faster start, metrics readable
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


_quiet = False  # see quiet_vllm
_eager = True  # see compile_engines


def set_cpu_defaults() -> None:
    """Environment for small models on this CPU; values already set by the user win."""
    for key, value in CPU_DEFAULTS.items():
        os.environ.setdefault(key, value)


def compile_engines() -> None:
    """Engines built from now on run the target as vLLM does by default, compiled (torch.compile), not eagerly.
    Eager is this harness's default: an engine starts here in ~30 s instead of ~90 s; results record which ran
    (`target_compiled`), and docs/smollm2-results.md compares the two."""
    global _eager
    _eager = False


def engines_are_eager() -> bool:
    """Whether engines (offline and served) run the target eagerly: see `compile_engines`."""
    return _eager


def quiet_vllm() -> None:
    """vLLM's INFO logs, weight-loading bars and import warnings out of a command's screen (before vLLM and torch
    are imported; VLLM_LOGGING_LEVEL set by the user wins). vLLM configures its logger only when an engine starts,
    so the level is also set on it now, for warnings its imports log (they would reach Python's last-resort
    handler); torch's C++ warnings (vllm-cpu's NUMA binding notes) follow TORCH_CPP_LOG_LEVEL."""
    global _quiet
    import logging
    import warnings

    level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(level.upper())
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    _quiet = True


@dataclass
class SpecFigures:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per verification step: 1 + accepted drafts per step."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def per_position_rate(self) -> list[float]:
        return [round(n / self.drafts, 4) if self.drafts else 0.0 for n in self.per_position]

    def minus(self, earlier: SpecFigures) -> SpecFigures:
        pad = earlier.per_position + [0] * (len(self.per_position) - len(earlier.per_position))
        return SpecFigures(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                           self.accepted - earlier.accepted, [a - b for a, b in zip(self.per_position, pad)])


def spec_figures(llm) -> SpecFigures:
    """vLLM's cumulative spec-decode counters (vllm:spec_decode_*) of an LLM built with log stats on."""
    values = {m.name: m for m in llm.get_metrics()}

    def scalar(name: str) -> int:
        m = values.get(name)
        return int(getattr(m, "value", 0) or 0) if m is not None else 0

    per_pos = values.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    return SpecFigures(scalar("vllm:spec_decode_num_drafts"), scalar("vllm:spec_decode_num_draft_tokens"),
                       scalar("vllm:spec_decode_num_accepted_tokens"),
                       [int(v) for v in getattr(per_pos, "values", [])] if per_pos is not None else [])


def lookup_draft_tokens(llm) -> int:
    """The verified drafts that prompt or corpus lookup gave so far (`peagle:lookup_draft_tokens`), of an LLM
    built with log stats on."""
    return int(sum(float(m.value) for m in llm.get_metrics() if m.name == "peagle:lookup_draft_tokens"))


def request_spec_figures(outs) -> SpecFigures:
    """Drafts verified, drafts and accepted per position, summed over the outputs' own spec-decode
    histograms (vLLM's per-request option; the process-wide counters would mix engines that run side
    by side)."""
    total = SpecFigures()
    for out in outs:
        m = out.outputs[0].spec_decode_metrics
        if m is None or not sum(m.histogram):
            continue
        hist = m.histogram
        total.drafts += sum(hist)
        total.draft_tokens += m.num_draft_tokens
        total.accepted += sum(j * n for j, n in enumerate(hist))
        for i in range(1, len(hist)):  # steps that accepted the draft at position i
            if i > len(total.per_position):
                total.per_position.append(0)
            total.per_position[i - 1] += sum(hist[i:])
    return total


@dataclass
class RunResult:
    token_ids: list[list[int]]
    seconds: float
    start_seconds: float
    spec: SpecFigures

    @property
    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.token_ids) / self.seconds


def make_llm(target: str, speculative_config: dict | None, max_model_len: int = 1024, **kwargs):
    from vllm import LLM

    kwargs.setdefault("use_tqdm_on_load", not _quiet)
    kwargs.setdefault("enforce_eager", _eager)
    return LLM(model=target, dtype="float32", max_model_len=max_model_len, seed=0,
               speculative_config=speculative_config, disable_log_stats=False, **kwargs)


def generate(target: str, speculative_config: dict | None, prompts: list[str], max_tokens: int,
             temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0, **engine_kwargs) -> RunResult:
    """Builds an engine, warms it up, and times one batched generation of `prompts`."""
    from vllm import SamplingParams

    t0 = time.perf_counter()
    llm = make_llm(target, speculative_config, **engine_kwargs)
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    before = spec_figures(llm)
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    result = RunResult([list(o.outputs[0].token_ids) for o in outputs], seconds, start,
                       spec_figures(llm).minus(before))
    close_llm(llm)
    return result


def close_llm(llm) -> None:
    """Shuts an in-process engine down now: left to the garbage collector, its shutdown can run
    during a later engine's start and tear down that engine's process groups."""
    import gc

    llm.llm_engine.engine_core.shutdown()
    gc.collect()
