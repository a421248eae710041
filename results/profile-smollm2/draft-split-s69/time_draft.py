"""Per-call wall time of the pieces of a p_eagle step's draft and verification, inside a compiled engine (K=4 fixed,
prompt and corpus lookup, one request at a time, 6 held-out prompts): each piece wrapped by a timer, the median
printed. With --torch-profiler instead: the PyTorch profiler over calls 200-260 of the draft (or of the
verification: --torch-profiler verify), their torch ops summed by name (own time), and the call's direct children
(inclusive time). --concurrency N: the first N held-out prompts decoded together, twice (128 tokens each, calls
20-60 profiled); --k K; --head-only: no lookups.

    PYTHONPATH=. .venv/bin/python results/profile-smollm2/draft-split-s69/time_draft.py [--eager]
        [--torch-profiler [draft|verify]] [--concurrency N] [--k K] [--head-only]
"""
import argparse
import collections
import os
import statistics
import time

parser = argparse.ArgumentParser()
parser.add_argument("--eager", action="store_true")
parser.add_argument("--torch-profiler", nargs="?", const="draft", choices=("draft", "verify"))
parser.add_argument("--concurrency", type=int, default=1)
parser.add_argument("--k", type=int, default=4)
parser.add_argument("--head-only", action="store_true")
opts = parser.parse_args()
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, so the wrappers reach it
from peagle_vllm.harness.runs import compile_engines, make_llm, quiet_vllm, set_cpu_defaults  # noqa: E402

set_cpu_defaults()
quiet_vllm()
if not opts.eager:
    compile_engines()
import vllm.v1.sample.sampler as vllm_sampler  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
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


PROFILED = (200, 260) if opts.concurrency == 1 else (20, 60)  # calls profiled, first and last
prof = profile(activities=[ProfilerActivity.CPU])


def profiled(original):
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == PROFILED[0]:
            prof.start()
        with record_function("CALL"):
            out = original(*args, **kwargs)
        if calls[0] == PROFILED[1]:
            prof.stop()
        return out

    return wrapper


def print_profile() -> None:
    calls = [e for e in prof.events() if e.name == "CALL"]
    n = len(calls)
    print("profiled calls", n, "mean ms", sum(e.cpu_time_total for e in calls) / n / 1000)
    ops = collections.defaultdict(lambda: [0, 0.0])  # name -> calls, own time (us), over every op under a call

    def walk(event):
        for child in event.cpu_children:
            ops[child.name][0] += 1
            ops[child.name][1] += child.self_cpu_time_total
            walk(child)

    children = collections.defaultdict(lambda: [0, 0.0])  # name -> calls, inclusive time (us), the call's children
    for call in calls:
        walk(call)
        for child in call.cpu_children:
            children[child.name][0] += 1
            children[child.name][1] += child.cpu_time_total
    print("ops per call", sum(v[0] for v in ops.values()) / n, "self total ms/call",
          sum(v[1] for v in ops.values()) / n / 1000)
    for title, table, top in (("", ops, 40), ("--- direct children (inclusive)", children, 30)):
        if title:
            print(title)
        for name, (count, us) in sorted(table.items(), key=lambda item: -item[1][1])[:top]:
            print(f"{us / n / 1000:8.3f} ms {count / n:6.1f}x  {name}")


if opts.torch_profiler == "draft":
    proposer.PEagleProposer._draft = profiled(proposer.PEagleProposer._draft)
elif opts.torch_profiler == "verify":
    sampler.PEagleRejectionSampler.forward = profiled(sampler.PEagleRejectionSampler.forward)
else:
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

lookups = {} if opts.head_only else {"prompt_lookup_max": 5, "lookup_corpus": "datasets/smollm2"}
llm = make_llm("models/SmolLM2-135M-Instruct", {
    "method": "p_eagle", "model": "models/smollm2-peagle-depth", "num_speculative_tokens": opts.k, "adaptive": False,
    **lookups}, max_num_seqs=opts.concurrency)
tokenizer = llm.get_tokenizer()
texts = [tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
         for prompt in held_out_prompts(6 if opts.concurrency == 1 else opts.concurrency)]
if opts.concurrency == 1:
    for text in texts:
        llm.generate([text], SamplingParams(max_tokens=128, temperature=0), use_tqdm=False)
else:
    for _ in range(2):
        llm.generate(texts, SamplingParams(max_tokens=128, temperature=0, ignore_eos=True), use_tqdm=False)
if opts.torch_profiler:
    print_profile()
for label, values in sorted(times.items(), key=lambda item: -statistics.median(item[1][50:] or item[1])):
    values = values[50:] or values  # the first calls (warm-up) left out
    print(f"{statistics.median(values) * 1000:8.3f} ms median  n={len(values)}  {label}")
