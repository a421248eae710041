"""Times PEagleRejectionSampler.forward inside one engine (the depth head at fixed K, T=1, top-p 0.9), cells
alternating between verification over the candidates (on) and over the whole vocabulary with the draft rows made
max_num_seqs at a time (off: the code before), three cells each, and counts the steps that took the candidates.
Run from the repository root: `PYTHONPATH=. .venv/bin/python results/sampler-candidates-s57/time_sampler.py C K [T]`
(T=0: greedy, where only the rows at once differ)."""
import statistics, sys, time
from pathlib import Path
from peagle_vllm.harness.runs import set_cpu_defaults, quiet_vllm, close_llm
set_cpu_defaults(); quiet_vllm()
from peagle_vllm.harness import bench
from peagle_vllm.harness.prompts import eval_prompts
from peagle_vllm.vllm_adapter.v1 import sampler as module

target = Path("models/SmolLM2-135M-Instruct")
on = {"flag": True}
taken = {"small": 0, "none": 0}
orig = module.on_candidates
def spy(*a):
    r = orig(*a) if on["flag"] else None
    taken["small" if r is not None else "none"] += on["flag"]
    return r
module.on_candidates = spy
times = {True: [], False: []}
fwd = module.PEagleRejectionSampler.forward
def timed(self, *a, **kw):
    self.max_rows = 64 if on["flag"] else conc  # off: the rows at once before CPU_ROWS (max_num_seqs here)
    t = time.perf_counter(); r = fwd(self, *a, **kw); times[on["flag"]].append(time.perf_counter() - t); return r
module.PEagleRejectionSampler.forward = timed
prompts = eval_prompts(target, 4, seed=1)
mode = next(m for m in bench.MODES if m.name == "p_eagle-depth")
conc, k = int(sys.argv[1]), int(sys.argv[2])
temperature = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
llm = bench._warm_engine(target, mode.spec(target, k), conc, prompts)
times[True].clear(); times[False].clear(); taken.update(small=0, none=0)
for rnd in range(3):
    for flag in (True, False):
        on["flag"] = flag
        bench._measure(llm, prompts, conc, 64, temperature, 0.0, 0.9)
close_llm(llm)
for f in (True, False):
    print(f"candidates={f}: sampler {statistics.median(times[f])*1e3:.2f} ms median over {len(times[f])} steps")
print(taken, "of the steps with candidates on")
import json; Path(__file__).with_name(f"time_sampler-c{conc}-k{k}{'-t0' if temperature == 0 else ''}.json").write_text(json.dumps({str(f): times[f] for f in times} | {"taken": taken}))
