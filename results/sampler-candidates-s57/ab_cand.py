"""Throughput A/B in one engine: verification over the candidates (on) against the whole vocabulary with the
draft rows made max_num_seqs at a time (off: the code before), cells alternating, T=1, top-p 0.9. Run from the
repository root: `PYTHONPATH=. .venv/bin/python results/sampler-candidates-s57/ab_cand.py ROUNDS MODE C,K ...`."""
import json, statistics, sys, time
from pathlib import Path
from peagle_vllm.harness.runs import set_cpu_defaults, quiet_vllm, close_llm
set_cpu_defaults(); quiet_vllm()
from peagle_vllm.harness import bench
from peagle_vllm.harness.prompts import eval_prompts
from peagle_vllm.vllm_adapter.v1 import sampler as module

target = Path("models/SmolLM2-135M-Instruct")
on = {"flag": True}
orig = module.on_candidates
module.on_candidates = lambda *a: orig(*a) if on["flag"] else None
prompts = eval_prompts(target, 4, seed=1)
fwd = module.PEagleRejectionSampler.forward
def forward(self, *a, **kw):
    self.max_rows = 64 if on["flag"] else CONC  # off: the rows at once before CPU_ROWS (max_num_seqs here)
    return fwd(self, *a, **kw)
module.PEagleRejectionSampler.forward = forward
mode = next(m for m in bench.MODES if m.name == sys.argv[2])
rounds = int(sys.argv[1])
cells = [tuple(map(int, c.split(","))) for c in sys.argv[3:]]
out = {}
for conc, k in cells:
    CONC = conc
    llm = bench._warm_engine(target, mode.spec(target, k), conc, prompts)
    tps = {True: [], False: []}
    for rnd in range(rounds):
        for flag in ([True, False] if rnd % 2 == 0 else [False, True]):
            on["flag"] = flag
            tps[flag].append(bench._measure(llm, prompts, conc, 64, 1.0, 0.0, 0.9)["tokens_per_s"])
    close_llm(llm)
    ratios = [a / b for a, b in zip(tps[True], tps[False])]
    out[f"c={conc} K={k}"] = {"on": statistics.median(tps[True]), "off": statistics.median(tps[False]),
                              "paired": statistics.median(ratios), "ratios": ratios}
    print(f"c={conc} K={k}: candidates {statistics.median(tps[True]):.1f} tok/s, whole vocabulary "
          f"{statistics.median(tps[False]):.1f}, paired {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
Path(__file__).with_name(f"ab_cand-{sys.argv[2]}.json").write_text(json.dumps(out, indent=1))
