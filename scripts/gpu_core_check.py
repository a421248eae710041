"""The per-step core on a real GPU (torch only, no vLLM, random weights and inputs at real sizes): what the CPU
tests hold with fake tensors, checked against CUDA itself.

1. No host sync: draft sampling, target distributions (every option), verification (every mode), the
   rollback capacity check, and vLLM 0.34's batch prompt lookup and corpus walk run under
   `torch.cuda.set_sync_debug_mode("error")`, which raises on any synchronizing CUDA call (a device read on the
   host, a blocking copy).
2. Memory: verification's peak on the CUDA allocator (`max_memory_allocated` beyond its inputs) against
   `AllocCounter`'s count of the same call on fake tensors, which `tests/unit/test_sampler_memory.py` trusts.
3. Graph capture: one decode step of the head (`gpu_bench.DecodeStep`) captured in a CUDA graph gives the
   eager step's drafts, and its replay time beside eager and `torch.compile`d replays.

    python scripts/gpu_core_check.py --out DIR      # writes DIR/gpu_core_check.json; exit 1 if a check fails
    python scripts/gpu_core_check.py --device cpu --hidden 256 --vocab 4096 --draft-vocab 1024 --context 64 \
        --batch 8 --mem-batch 2                     # the script's own check, at CPU sizes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import DecodeStep, capture, median_seconds  # noqa: E402
from peagle_vllm.batch_lookup import last_tokens, prompt_lookup  # noqa: E402
from peagle_vllm.corpus_lookup import CorpusLookup  # noqa: E402
from peagle_vllm.corpus_table import CorpusTable  # noqa: E402
from peagle_vllm.harness.alloc_counter import AllocCounter  # noqa: E402
from peagle_vllm.head import HeadConfig, PEagleHead  # noqa: E402
from peagle_vllm.proposer import sample_drafts  # noqa: E402
from peagle_vllm.rollback import beyond_capacity  # noqa: E402
from peagle_vllm.verify import target_probs, verify  # noqa: E402

GIB = 2**30


@contextmanager
def syncs_raise(device: str):
    """Any synchronizing CUDA call inside raises (on CPU: nothing to check, the block just runs)."""
    if device != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def step_inputs(b: int, k: int, v: int, vd: int, device: str, seed: int = 0) -> dict:
    """One step's tensors: b requests x k drafts over a target vocabulary v (draft vocabulary vd)."""
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(b, k, v, device=device, generator=g) * 3
    num = torch.randint(0, k + 1, (b,), device=device, generator=g)
    drafts = torch.randint(0, v, (b, k), device=device, generator=g)
    drafts = torch.where(torch.arange(k, device=device) < num.unsqueeze(1), drafts, -1)
    temperature = torch.rand(b, device=device, generator=g) * 1.5
    temperature[: b // 4] = 0.0
    return dict(logits=logits, num=num, drafts=drafts, temperature=temperature,
                top_k=torch.randint(0, 100, (b,), device=device, generator=g),
                top_p=torch.rand(b, device=device, generator=g) * 0.5 + 0.5,
                min_p=torch.rand(b, device=device, generator=g) * 0.1,
                bonus=torch.randint(0, v, (b,), device=device, generator=g),
                draft_logits=torch.randn(b, k, vd, device=device, generator=g),
                draft_to_target=torch.randperm(v, device=device, generator=g)[:vd])


def check_no_host_sync(args) -> dict:
    """Each per-step function under the sync check, at b requests x K drafts x V."""
    x = step_inputs(args.batch, args.k, args.vocab, args.draft_vocab, args.device)
    b, k, v = x["logits"].shape
    rows = lambda t: t.repeat_interleave(k)  # noqa: E731
    probs = target_probs(x["logits"].view(-1, v), rows(x["temperature"])).view(b, k, v)
    argmax = x["logits"].argmax(-1)
    greedy = x["temperature"] == 0
    _, q = sample_drafts(x["draft_logits"], x["draft_to_target"], x["temperature"], None, v)
    positions = torch.arange(b * (k + 1), device=args.device) % (k + 1) + 100
    per_request = torch.full((b,), k + 1, device=args.device)
    capacity = torch.randint(100, 100 + k + 2, (b,), device=args.device)
    slots = torch.arange(b, device=args.device)
    history = torch.randint(0, 50, (b, 4096), dtype=torch.int32, device=args.device)  # [b, 4096] token histories
    held = torch.randint(1, 4097, (b,), device=args.device)
    answers = torch.randint(0, 50, (400, 60), generator=torch.Generator().manual_seed(0)).tolist()
    corpus = CorpusTable.of(CorpusLookup([([], answer) for answer in answers])).to(args.device)
    cases = {
        "sample_drafts greedy": lambda: sample_drafts(x["draft_logits"], x["draft_to_target"], None, None, v),
        "sample_drafts sampled, top-k/top-p": lambda: sample_drafts(
            x["draft_logits"], x["draft_to_target"], x["temperature"], None, v, x["top_k"], x["top_p"]),
        "target_probs every option": lambda: target_probs(
            x["logits"].view(-1, v), rows(x["temperature"]), rows(x["top_k"]), rows(x["top_p"]), rows(x["min_p"])),
        "verify greedy": lambda: verify("auto", x["drafts"], x["num"], None, None, argmax, x["bonus"],
                                        torch.ones_like(greedy)),
        "verify standard, mixed batch": lambda: verify("standard", x["drafts"], x["num"], q, probs, argmax,
                                                       x["bonus"], greedy),
        "verify block, mixed batch": lambda: verify("block", x["drafts"], x["num"], q, probs, argmax, x["bonus"],
                                                    greedy),
        "verify block, lossy greedy": lambda: verify("block", x["drafts"], x["num"], q, probs, argmax, x["bonus"],
                                                     greedy, accept_k=3, accept_tolerance=1.0,
                                                     target_logits=x["logits"]),
        "beyond_capacity": lambda: beyond_capacity(positions, per_request, capacity),
        "prompt lookup (vLLM 0.34)": lambda: prompt_lookup(history, slots, held, k, 2, 5),
        "corpus walk (vLLM 0.34)": lambda: corpus.continuation(last_tokens(history, slots, held, corpus.max_n), k),
    }
    out = {}
    for name, fn in cases.items():
        try:
            with syncs_raise(args.device):
                fn()
            out[name] = "no sync"
        except Exception as exc:  # the first synchronizing call, with where it came from in this project
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if "peagle_vllm" in f.filename]
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} `{frames[-1].line}`" if frames else ""
            out[name] = f"SYNC{where}: {str(exc).splitlines()[0]}"
        print(f"  {name}: {out[name]}", flush=True)
    return out


def check_memory(args) -> dict:
    """Peak bytes of a sampled-batch verification beyond its inputs: CUDA's allocator against AllocCounter."""
    b, k, v = args.mem_batch, args.k, args.vocab

    def inputs(device: str, fake: bool):
        with FakeTensorMode() if fake else nullcontext():
            probs = torch.rand(b, k, v, device=device).softmax(-1)
            q = torch.rand(b, k, v, device=device).softmax(-1)
            drafts = torch.randint(0, v, (b, k), device=device)
            return dict(drafts=drafts, num=torch.full((b,), k, device=device), q=q, probs=probs,
                        argmax=probs.argmax(-1), bonus=torch.zeros(b, dtype=torch.long, device=device),
                        greedy=torch.zeros(b, dtype=torch.bool, device=device))

    out = {"batch": b, "k": k, "vocab": v}
    for mode in ("standard", "block"):
        call = lambda x: verify(mode, x["drafts"], x["num"], x["q"], x["probs"], x["argmax"], x["bonus"],  # noqa: E731
                                x["greedy"])
        fake = inputs(args.device, fake=True)
        with fake["probs"].fake_mode, AllocCounter() as counter:
            call(fake)
        counted = counter.peak
        if args.device == "cuda":
            x = inputs("cuda", fake=False)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            result = call(x)
            torch.cuda.synchronize()
            measured = torch.cuda.max_memory_allocated() - base
            del x, result
            torch.cuda.empty_cache()
        else:
            measured = None
        out[mode] = dict(counted_gib=counted / GIB, measured_gib=None if measured is None else measured / GIB,
                         inputs_gib=2 * b * k * v * 4 / GIB)
        shown = "n/a" if measured is None else f"{measured / GIB:.3f}"
        print(f"  verify {mode}, {b} x {k} x {v}: counted {counted / GIB:.3f} GiB, CUDA allocator {shown} GiB "
              f"(inputs {2 * b * k * v * 4 / GIB:.2f} GiB)", flush=True)
    return out


def check_graphs(args) -> dict:
    """The head's decode step: eager, CUDA graph, torch.compile + CUDA graph; same drafts, time each."""
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cfg = HeadConfig(hidden_size=args.hidden, vocab_size=args.vocab, draft_vocab_size=args.draft_vocab,
                     intermediate_size=int(args.hidden * 2.75) // 64 * 64, num_attention_heads=args.hidden // 128,
                     num_key_value_heads=max(1, args.hidden // 512), aux_layer_ids=[2, 16, 29], mask_token_id=0,
                     variant="depth", trained_depth=32, fc_norm=True, norm_output=True)
    torch.manual_seed(0)
    head = PEagleHead(cfg).to(args.device, dtype).eval()
    out = {}
    with torch.inference_mode():
        for b, k in [(1, 8), (1, 32), (64, 8)]:
            step = DecodeStep(head, b, args.context, k)
            eager = step()
            row = {"eager_ms": median_seconds(step, args.device, 50) * 1e3}
            if args.device == "cuda":
                replay, static = capture(step)
                replay()
                torch.cuda.synchronize()
                row["graph_same_drafts"] = bool(torch.equal(static, eager))
                row["graph_ms"] = median_seconds(replay, args.device, 50) * 1e3
                if not args.no_compile:
                    try:
                        t0 = time.perf_counter()
                        compiled = torch.compile(step, dynamic=False)
                        compiled()
                        row["compile_s"] = time.perf_counter() - t0
                        replay_c, static_c = capture(compiled)
                        replay_c()
                        torch.cuda.synchronize()
                        row["compiled_graph_agreement"] = float((static_c == eager).float().mean())
                        row["compiled_graph_ms"] = median_seconds(replay_c, args.device, 50) * 1e3
                    except Exception as exc:
                        row["compile_error"] = str(exc).splitlines()[0][:300]
            out[f"b{b}_k{k}"] = row
            print(f"  batch {b}, K={k}: {row}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=64, help="requests in the sync check")
    p.add_argument("--mem-batch", type=int, default=64, help="requests in the memory check")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128_256)
    p.add_argument("--draft-vocab", type=int, default=32_000)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report = {"device": name, "torch": torch.__version__}
    print(f"device {name}, torch {torch.__version__}", flush=True)
    for key, check in [("no_host_sync", check_no_host_sync), ("memory", check_memory), ("graphs", check_graphs)]:
        print(f"{key}:", flush=True)
        try:
            report[key] = check(args)
        except Exception as exc:
            report[key] = {"error": traceback.format_exc()[-2000:]}
            print(report[key]["error"], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_core_check.json").write_text(json.dumps(report, indent=1))
    failed = [k for k, v in report.get("no_host_sync", {}).items() if not str(v).startswith("no sync")]
    failed += [k for k, v in report.get("graphs", {}).items() if v.get("graph_same_drafts") is False]
    failed += [k for k in ("no_host_sync", "memory", "graphs") if "error" in report.get(k, {})]
    print("FAILED: " + ", ".join(failed) if failed else "all checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
