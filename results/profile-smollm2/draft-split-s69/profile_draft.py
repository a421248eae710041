"""The PyTorch profiler over p_eagle's draft (`PEagleProposer._draft`, K=4 fixed, prompt and corpus lookup) inside a
compiled engine, one request at a time: draft calls 200-260 profiled, their torch ops summed by name (own time), and
the draft's direct children (inclusive time).

    PYTHONPATH=. .venv/bin/python results/profile-smollm2/draft-split-s69/profile_draft.py [--eager]
"""
import os, sys, collections
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from peagle_vllm.harness.runs import set_cpu_defaults, quiet_vllm, make_llm, compile_engines
set_cpu_defaults(); quiet_vllm()
if "--eager" not in sys.argv:
    compile_engines()
import torch
from torch.profiler import profile, record_function, ProfilerActivity
from peagle_vllm.vllm_adapter.v1 import proposer as P
from peagle_vllm.harness.corpus import held_out_prompts
K = int(os.environ.get("K", "4"))
calls = {"n": 0}
prof = profile(activities=[ProfilerActivity.CPU])
orig = P.PEagleProposer._draft
def _draft(self, *a, **kw):
    calls["n"] += 1
    n = calls["n"]
    if n == 200: prof.start()
    with record_function("DRAFT"):
        out = orig(self, *a, **kw)
    if n == 260: prof.stop()
    return out
P.PEagleProposer._draft = _draft
from vllm import SamplingParams
llm = make_llm("models/SmolLM2-135M-Instruct", {"method":"p_eagle","model":"models/smollm2-peagle-depth",
  "num_speculative_tokens":K,"adaptive":False,"prompt_lookup_max":5,"lookup_corpus":"datasets/smollm2"})
tok = llm.get_tokenizer()
ps = [tok.apply_chat_template([{"role":"user","content":p}], tokenize=False, add_generation_prompt=True) for p in held_out_prompts(6)]
for p in ps:
    llm.generate([p], SamplingParams(max_tokens=128, temperature=0), use_tqdm=False)
print("draft calls", calls["n"])
evs = prof.events()
drafts = [e for e in evs if e.name == "DRAFT"]
print("profiled drafts", len(drafts), "mean ms", sum(e.cpu_time_total for e in drafts)/len(drafts)/1000)
agg = collections.defaultdict(lambda: [0, 0.0])
def walk(e):
    for c in e.cpu_children:
        agg[c.name][0] += 1; agg[c.name][1] += c.self_cpu_time_total
        walk(c)
for d in drafts: walk(d)
tot = sum(v[1] for v in agg.values())
print("ops per draft", sum(v[0] for v in agg.values())/len(drafts), "self total ms/draft", tot/len(drafts)/1000)
for name, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:40]:
    print(f"{t/len(drafts)/1000:8.3f} ms {n/len(drafts):6.1f}x  {name}")
# top-level children of DRAFT (python-level structure)
top = collections.defaultdict(lambda: [0, 0.0])
for d in drafts:
    for c in d.cpu_children:
        top[c.name][0]+=1; top[c.name][1]+=c.cpu_time_total
print("--- direct children (inclusive)")
for name, (n, t) in sorted(top.items(), key=lambda x: -x[1][1])[:30]:
    print(f"{t/len(drafts)/1000:8.3f} ms {n/len(drafts):6.1f}x  {name}")
