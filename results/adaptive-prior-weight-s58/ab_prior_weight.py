"""Adaptive depth's prior weight in batches of more than one request (`DepthOptions.batch_prior_weight`) A/B in one
process: fixed K and one adaptive engine (K_max 8) per weight W, all built at once, the benchmark's cell (C
concurrent, PROMPTS held-out prompts x 64 tokens, temperature T, top-p 0.9) in ROUNDS interleaved rounds; paired
ratios against the fixed K (K 0: no speculation). The logs beside it (ab.log, ab-c4-t1-12.log) are its output; the
first A/B in docs/adaptive-depth-log.md set `prior_weight` (both weights) instead. Run from the repository root:
`PYTHONPATH=. .venv/bin/python results/adaptive-prior-weight-s58/ab_prior_weight.py C K T PROMPTS ROUNDS W [W ...]`"""
import dataclasses, json, statistics, sys
from pathlib import Path
from peagle_vllm.harness.runs import set_cpu_defaults, quiet_vllm, close_llm
set_cpu_defaults(); quiet_vllm()
from peagle_vllm.harness import bench
from peagle_vllm.harness.prompts import eval_prompts
from peagle_vllm.depth import regime

conc, k, temperature, n_prompts, rounds = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]),
                                            int(sys.argv[5]))
weights = [float(w) for w in sys.argv[6:]]
weight = {"now": None}
init = regime.DepthController.__init__
def built_with(self, options):
    init(self, dataclasses.replace(options, batch_prior_weight=weight["now"]) if weight["now"] is not None else options)
regime.DepthController.__init__ = built_with
target = Path("models/SmolLM2-135M-Instruct")
prompts = eval_prompts(target, n_prompts, seed=1)
modes = {m.name: m for m in bench.MODES}
reference = modes["p_eagle-depth"].spec(target, k) if k else None  # K 0: no speculation
engines = {f"K={k}": bench._warm_engine(target, reference, conc, prompts)}
for w in weights:
    weight["now"] = w
    engines[f"adaptive w={w:g}"] = bench._warm_engine(target, modes["p_eagle-depth-adaptive"].spec(target, 8), conc,
                                                      prompts)
speeds = {name: [] for name in engines}
for r in range(rounds):
    for name, llm in (engines.items() if r % 2 == 0 else reversed(engines.items())):
        speeds[name].append(bench._measure(llm, prompts, conc, 64, temperature, 0.0, 0.9)["tokens_per_s"])
    print(f"round {r}: " + ", ".join(f"{n} {s[-1]:.1f}" for n, s in speeds.items()), flush=True)
for llm in engines.values():
    close_llm(llm)
fixed = speeds[f"K={k}"]
for name, s in speeds.items():
    ratios = sorted(a / b for a, b in zip(s, fixed))
    print(f"{name}: median {statistics.median(s):.1f} tokens/s, paired over K={k} {statistics.median(ratios):.3f} "
          f"({ratios[0]:.3f}-{ratios[-1]:.3f})")
Path(__file__).with_name(f"ab-c{conc}-k{k}-t{temperature:g}.json").write_text(json.dumps(speeds))
