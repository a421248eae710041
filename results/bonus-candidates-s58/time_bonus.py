"""Times the draw of the token after the drafts (`CandidateTopKTopP.forward`, top-p and the draw) and the whole
rejection sampler inside one engine (the depth head at fixed K, T=1, top-p 0.9), cells alternating between draws
among the candidates (on) and the mask over the whole vocabulary with vLLM's draw (off: the code before), three
cells each. Run from the repository root:
`PYTHONPATH=. .venv/bin/python results/bonus-candidates-s58/time_bonus.py C K` (C concurrent requests, fixed K)."""
import json, statistics, sys, time
from pathlib import Path
from peagle_vllm.harness.runs import set_cpu_defaults, quiet_vllm, close_llm
set_cpu_defaults(); quiet_vllm()
from peagle_vllm.harness import bench
from peagle_vllm.harness.prompts import eval_prompts
from peagle_vllm.vllm_adapter.v1 import sampler as module
from peagle_vllm.vllm_adapter.v1.bonus_sampler import CandidateTopKTopP

target = Path("models/SmolLM2-135M-Instruct")
on = {"flag": True}
draw = {True: [], False: []}
step = {True: [], False: []}
new_forward = CandidateTopKTopP.forward
def timed_draw(self, logits, generators, k, p):
    t = time.perf_counter()
    r = new_forward(self, logits, generators, k, p) if on["flag"] else self._cut_and_draw(logits, generators, k, p)
    draw[on["flag"]].append(time.perf_counter() - t); return r
CandidateTopKTopP.forward = timed_draw
fwd = module.PEagleRejectionSampler.forward
def timed(self, *a, **kw):
    t = time.perf_counter(); r = fwd(self, *a, **kw); step[on["flag"]].append(time.perf_counter() - t); return r
module.PEagleRejectionSampler.forward = timed
prompts = eval_prompts(target, 4, seed=1)
mode = next(m for m in bench.MODES if m.name == "p_eagle-depth")
conc, k = int(sys.argv[1]), int(sys.argv[2])
llm = bench._warm_engine(target, mode.spec(target, k), conc, prompts)
for d in (draw, step):
    d[True].clear(); d[False].clear()
for rnd in range(3):
    for flag in (True, False):
        on["flag"] = flag
        bench._measure(llm, prompts, conc, 64, 1.0, 0.0, 0.9)
close_llm(llm)
for f in (True, False):
    print(f"candidates={f}: draw {statistics.median(draw[f])*1e3:.2f} ms, rejection sampler "
          f"{statistics.median(step[f])*1e3:.2f} ms (medians over {len(draw[f])} draws, {len(step[f])} steps)")
Path(__file__).with_name(f"time_bonus-c{conc}-k{k}.json").write_text(
    json.dumps({"draw": {str(f): draw[f] for f in draw}, "rejection_sampler": {str(f): step[f] for f in step}}))
