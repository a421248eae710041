"""Adaptive depth at c=16, the target compiled, both lookups (K_max 8; --k-max, --head-only): every choice and every
step the controller is told of, logged round by round beside a plain engine (rounds alternating, the benchmark's cell:
16 held-out prompts sent twice, 128 tokens, after its warm-up cell); then per round, how many steps speculated, their
time and tokens.

    PYTHONPATH=. .venv/bin/python results/profile-smollm2/c16-s70/trace_adaptive.py --rounds 4 --log trace.json.gz
    PYTHONPATH=. .venv/bin/python results/profile-smollm2/c16-s70/trace_adaptive.py --summary-of trace.json.gz
"""
import argparse
import collections
import gzip
import json
import statistics
from pathlib import Path


def summarize(trace: dict) -> None:
    for row in trace["res"]:
        print(f"round {row['round']} {row['mode']:9s} {row['tps']:6.1f} tokens/s  acceptance {row['acc']:.2f}")
    by_round = collections.defaultdict(list)
    for event in trace["log"]:
        by_round[event["t"]].append(event)
    for tag, events in by_round.items():
        steps = [e for e in events if e["ev"] == "step"]
        spec = [s for s in steps if s["rows"]]
        ks = collections.Counter(k for e in events if e["ev"] == "choose" for k in e["ks"])
        print(f"{tag}: {len(steps)} steps, {len(spec)} drafted; {sum(s['s'] for s in steps):.2f} s, drafting "
              f"{sum(s['s'] for s in spec):.2f} s; tokens {sum(s['emit'] for s in steps)}, drafting "
              f"{sum(s['emit'] for s in spec)}; K chosen per request-step {dict(sorted(ks.items()))}")
        verifying = [s for s in spec if s["ver"]]
        opening = [s for s in spec if not s["ver"]]  # a draft with nothing to verify: a switch's first step
        plain = [s for s in steps if not s["rows"]]
        for name, group in (("verifying", verifying), ("opening", opening), ("plain", plain)):
            full = [s for s in group if s["req"] == 16]
            if full:
                ms = 1e3 * statistics.median(s["s"] for s in full)
                print(f"    {name} steps of 16 requests: {len(full)}, median {ms:.1f} ms, "
                      f"{statistics.mean(s['emit'] for s in full):.1f} tokens a step")


def trace(rounds: int, k_max: int, head_only: bool) -> dict:
    from peagle_vllm.harness import runs

    runs.set_cpu_defaults()
    runs.quiet_vllm()
    runs.compile_engines()
    from peagle_vllm.depth import regime
    from peagle_vllm.harness import bench
    from peagle_vllm.harness.prompts import eval_prompts

    log, tag = [], ["warm-up"]
    choose, observe_step = regime.DepthController.choose, regime.DepthController.observe_step

    def logged_choose(self, req_ids, caps=None, sampled=False):
        ks = choose(self, req_ids, caps, sampled)
        log.append({"t": tag[0], "ev": "choose", "n": len(req_ids), "ks": list(ks), "spec": self.speculating})
        return ks

    def logged_step(self, step):
        log.append({"t": tag[0], "ev": "step", "req": step.requests, "tok": step.tokens, "rows": step.draft_rows,
                    "ver": step.verified, "emit": step.emitted, "s": step.seconds})
        return observe_step(self, step)

    regime.DepthController.choose, regime.DepthController.observe_step = logged_choose, logged_step
    target = Path("models/SmolLM2-135M-Instruct")
    prompts = eval_prompts(target, 16)
    mode = next(m for m in bench.MODES
                if m.name == ("p_eagle-depth-adaptive" if head_only else "p_eagle-depth-adaptive-lookup-corpus"))
    engines = {"plain": bench._warm_engine(target, None, 16, prompts),
               "adaptive": bench._warm_engine(target, mode.spec(target, k_max), 16, prompts)}
    res = []
    for r in range(rounds):
        for name in (("plain", "adaptive") if r % 2 == 0 else ("adaptive", "plain")):
            tag[0] = f"round {r} {name}"
            m = bench._measure(engines[name], prompts, 16, 128, 0.0)
            res.append({"round": r, "mode": name, "tps": m["tokens_per_s"], "acc": m["acceptance_length"]})
    return {"res": res, "log": log}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--k-max", type=int, default=8)
    parser.add_argument("--head-only", action="store_true", help="no lookups")
    parser.add_argument("--log", type=Path, help="write the trace here (gzipped JSON)")
    parser.add_argument("--summary-of", type=Path, help="summarize a trace written before instead of running")
    args = parser.parse_args()
    if args.summary_of:
        result = json.loads(gzip.decompress(args.summary_of.read_bytes()))
    else:
        result = trace(args.rounds, args.k_max, args.head_only)
    if args.log:
        args.log.write_bytes(gzip.compress(json.dumps(result).encode()))
    summarize(result)
