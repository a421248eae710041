"""Times the draft sampling (sample_drafts), vLLM's draft_probs gather, the rejection sampler and the whole engine
step inside one engine (the depth head at fixed K, T=1, top-p 0.9, two cells after the warm-up). Run from the
repository root: `PYTHONPATH=. .venv/bin/python results/sampler-candidates-s57/time_q.py C K`."""
import statistics, sys, time
from pathlib import Path
from peagle_vllm.harness.runs import set_cpu_defaults, quiet_vllm, close_llm
set_cpu_defaults(); quiet_vllm()
from peagle_vllm.harness import bench
from peagle_vllm.harness.prompts import eval_prompts
from peagle_vllm.vllm_adapter.v1 import proposer as prop, sampler as smod
from vllm.v1.worker import gpu_model_runner as gmr

times = {"sample_drafts": [], "get_draft_probs": [], "rejection": [], "step": []}
def wrap(owner, name, key):
    f = getattr(owner, name)
    def w(*a, **kw):
        t = time.perf_counter(); r = f(*a, **kw); times[key].append(time.perf_counter() - t); return r
    setattr(owner, name, w)
wrap(prop, "sample_drafts", "sample_drafts")
wrap(gmr.GPUModelRunner, "_get_spec_decode_draft_probs", "get_draft_probs")
wrap(smod.PEagleRejectionSampler, "forward", "rejection")
from vllm.v1.engine.core import EngineCore
wrap(EngineCore, "step", "step")
target = Path("models/SmolLM2-135M-Instruct")
prompts = eval_prompts(target, 4, seed=1)
mode = next(m for m in bench.MODES if m.name == "p_eagle-depth")
conc, k = int(sys.argv[1]), int(sys.argv[2])
llm = bench._warm_engine(target, mode.spec(target, k), conc, prompts)
for key in times: times[key].clear()
for rnd in range(2):
    bench._measure(llm, prompts, conc, 64, 1.0, 0.0, 0.9)
close_llm(llm)
for key, v in times.items():
    print(f"{key}: {statistics.median(v)*1e3:.2f} ms median over {len(v)}")
