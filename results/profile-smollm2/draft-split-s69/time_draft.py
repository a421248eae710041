"""Per-call wall time of the pieces of a p_eagle step's draft and verification, inside a compiled engine (K=4 fixed,
prompt and corpus lookup, one request at a time): each piece wrapped by a timer, the median printed.

    PYTHONPATH=. .venv/bin/python results/profile-smollm2/draft-split-s69/time_draft.py [--eager]
"""
import collections
import os
import statistics
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so the wrappers reach it
from peagle_vllm.harness.runs import compile_engines, make_llm, quiet_vllm, set_cpu_defaults  # noqa: E402

set_cpu_defaults()
quiet_vllm()
if "--eager" not in sys.argv:
    compile_engines()
import vllm.v1.sample.sampler as vllm_sampler  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker import gpu_model_runner  # noqa: E402

from peagle_vllm.harness.corpus import held_out_prompts  # noqa: E402
from peagle_vllm.vllm_adapter.v1 import draft_model, proposer, sampler  # noqa: E402

times = collections.defaultdict(list)


def timed(owner, name, label=None):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        times[label or name].append(time.perf_counter() - start)
        return out

    setattr(owner, name, wrapper)


for name in ("_draft", "set_inputs_first_pass", "build_per_group_and_layer_attn_metadata",
             "_determine_batch_execution_and_padding", "build_model_inputs_first_pass", "_sanitize",
             "_get_slot_mapping"):
    timed(proposer.PEagleProposer, name)
for name in ("forward", "draft_logits", "combine_hidden_states"):
    timed(draft_model.PEagleDraftModel, name)
timed(proposer, "sample_drafts")
timed(sampler.PEagleRejectionSampler, "forward", "rejection forward")
timed(sampler, "verify", "verify()")
timed(vllm_sampler.Sampler, "forward", "vllm Sampler.forward (bonus)")
for name in ("_sample", "_bookkeeping_sync", "sample_tokens", "propose_draft_token_ids"):
    timed(gpu_model_runner.GPUModelRunner, name, f"runner {name}")

llm = make_llm("models/SmolLM2-135M-Instruct", {
    "method": "p_eagle", "model": "models/smollm2-peagle-depth", "num_speculative_tokens": 4, "adaptive": False,
    "prompt_lookup_max": 5, "lookup_corpus": "datasets/smollm2"})
tokenizer = llm.get_tokenizer()
for prompt in held_out_prompts(6):
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    llm.generate([text], SamplingParams(max_tokens=128, temperature=0), use_tqdm=False)
for label, values in sorted(times.items(), key=lambda item: -statistics.median(item[1][50:] or item[1])):
    values = values[50:] or values  # the first calls (warm-up) left out
    print(f"{statistics.median(values) * 1000:8.3f} ms median  n={len(values)}  {label}")
