"""Where an engine step's time goes: one request at a time (or `--concurrency` N held-out prompts together), a plain
engine against a p_eagle engine (fixed K), each phase timed inside the engine by wrappers installed before it starts
(in-process engine):

- vLLM's own phases: scheduling (`Scheduler.schedule`), input preparation (`_prepare_inputs`), the target's
  forward (`_model_forward`, by number of tokens), sampling / verification (`_sample`), bookkeeping
  (`_bookkeeping_sync`), drafting (`propose_draft_token_ids`: input building, the head's forward, draft
  sampling), the scheduler's update (`update_from_output`, `update_draft_token_ids`);
- our hooks: every patch of `vllm_adapter/v1/patches.py` is timed twice, around our replacement and around
  vLLM's original inside it; the difference is our code's own time.
Phases nest (a hook runs inside a vLLM phase), so the table is read per row, not summed; "step" is the whole
`EngineCore.step`. Run `python -m peagle_vllm.harness.profile_step --target DIR [--speculative-config JSON]`.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

PHASES = {  # (owner, attribute) -> phase name
    ("vllm.v1.engine.core:EngineCore", "step"): "step",
    ("vllm.v1.core.sched.scheduler:Scheduler", "schedule"): "schedule",
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "_prepare_inputs"): "prepare inputs",
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "_model_forward"): "target forward",
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "_sample"): "sample / verify",
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "_bookkeeping_sync"): "bookkeeping",
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner", "propose_draft_token_ids"): "draft",
    ("vllm.v1.core.sched.scheduler:Scheduler", "update_from_output"): "scheduler update",
    ("vllm.v1.core.sched.scheduler:Scheduler", "update_draft_token_ids"): "draft ids to scheduler",
}


class StepClock:
    """Seconds per phase per engine step; `forward_tokens` keeps the target forward's token count per step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.forward_tokens: list[int] = []

    def timed(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - t0
                if name == "step":
                    self.steps.append(dict(self.current))
                    self.current.clear()

        return wrapper

    def timed_forward(self, fn):
        @functools.wraps(fn)
        def wrapper(runner, input_ids=None, positions=None, *args, **kwargs):
            tokens = positions.shape[-1] if positions is not None else input_ids.shape[0]
            self.current["forward tokens"] = tokens
            return self.timed("target forward", fn)(runner, input_ids, positions, *args, **kwargs)

        return wrapper


CLOCK = StepClock()
_instrumented = False


def instrument(clock: StepClock = CLOCK) -> None:
    """Wraps vLLM's phases and installs the V1 adapter with every patch timed inside and out, once per process
    (before any engine exists, in the process that runs it)."""
    global _instrumented
    if _instrumented:
        return
    _instrumented = True
    from peagle_vllm.vllm_adapter import v1
    from peagle_vllm.vllm_adapter.v1.patches import PATCHES, Patch, resolve
    from peagle_vllm.vllm_adapter.version import installed_vllm_version

    def hooked(patch: Patch) -> Patch:
        name = f"hook {patch.attribute}"
        return Patch(patch.owner, patch.attribute,
                     lambda original: clock.timed(name, patch.wrap(clock.timed(name + " (vLLM)", original))),
                     patch.why, patch.required, patch.only_on_cpu)

    v1.install(installed_vllm_version(), tuple(hooked(p) for p in PATCHES))
    for (owner, attribute), name in PHASES.items():
        cls = resolve(owner)
        fn = getattr(cls, attribute)
        setattr(cls, attribute, clock.timed_forward(fn) if name == "target forward" else clock.timed(name, fn))


def _summary(steps: list[dict[str, float]]) -> dict[str, float]:
    """Median milliseconds per phase over the steps; our hooks' own time as outer minus inner."""
    names = sorted({n for s in steps for n in s if n != "forward tokens"})
    out = {n: 1e3 * statistics.median(s.get(n, 0.0) for s in steps) for n in names}
    hooks = [n for n in names if n.startswith("hook ") and not n.endswith("(vLLM)")]
    own = [sum(s.get(h, 0.0) - s.get(h + " (vLLM)", 0.0) for h in hooks) for s in steps]
    out["our hooks (own time)"] = 1e3 * statistics.median(own)
    return out


def decode_steps(steps: list[dict[str, float]], batch: int, k: int) -> list[dict[str, float]]:
    """The steps whose target forward computed `batch` to `batch` x (K + 1) tokens: decode steps (a prefill, or a
    prompt's chunk beside decodes, computes more), most of them of the whole batch (a plain step of fewer requests
    computes fewer)."""
    return [s for s in steps if batch <= s.get("forward tokens", 0) <= batch * (k + 1)]


def profile(target: str, spec: dict | None, prompts: list[str], max_tokens: int, temperature: float = 0.0,
            top_p: float = 1.0) -> dict:
    """The decode steps (`decode_steps`) of `prompts` run together, after a warm-up, split by the target forward's
    token count."""
    from vllm import SamplingParams

    from peagle_vllm.harness.runs import close_llm, make_llm

    clock = CLOCK
    instrument(clock)
    batch = len(prompts)
    llm = make_llm(target, spec, max_num_seqs=batch, enable_prefix_caching=False)
    params = dict(temperature=temperature, top_p=top_p)  # unseeded, as the benchmark's requests
    llm.generate(prompts, SamplingParams(max_tokens=16, **params), use_tqdm=False)  # warm-up
    clock.steps.clear()
    clock.current.clear()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params), use_tqdm=False)
    close_llm(llm)
    decode = decode_steps(clock.steps, batch, (spec or {}).get("num_speculative_tokens", 0))
    by_tokens: dict[int, list[dict]] = defaultdict(list)
    for s in decode:
        by_tokens[int(s.get("forward tokens", 0))].append(s)
    return {"requests": batch, "tokens": sum(len(o.outputs[0].token_ids) for o in outs), "steps": len(decode),
            "by_forward_tokens": {n: {"steps": len(s), "ms": _summary(s)} for n, s in sorted(by_tokens.items())},
            "all": _summary(decode)}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--speculative-config", help="JSON; omitted: plain decoding")
    parser.add_argument("--prompt", default="Write a Python function that reverses a string.",
                        help="the request at concurrency 1")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="N > 1: the first N held-out prompts decoded together instead of --prompt")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--compiled", action="store_true", help="the target compiled, as vLLM runs it by default")
    args = parser.parse_args()
    from peagle_vllm.harness.prompts import chat_prompts, eval_prompts
    from peagle_vllm.harness.runs import compile_engines, quiet_vllm, set_cpu_defaults

    set_cpu_defaults()
    quiet_vllm()
    if args.compiled:
        compile_engines()
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    prompts = chat_prompts(args.target, [args.prompt]) if args.concurrency == 1 else \
        eval_prompts(args.target, args.concurrency)
    result = profile(args.target, spec, prompts, args.max_tokens, args.temperature, args.top_p)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
