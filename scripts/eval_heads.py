"""Acceptance of the demo heads on held-out prompts, in vLLM, at K = 8, 16, 32 (fixed K): our depth and
standard heads with p_eagle, the standard head in vLLM's built-in parallel drafting, and the eagle3 head
in vLLM's sequential eagle3. Greedy and sampled (T=1). Prints a markdown table; --json writes the figures.

    python scripts/eval_heads.py --json acceptance.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from peagle_vllm.harness.runs import generate, set_cpu_defaults

REPO = Path(__file__).resolve().parent.parent
RUNS = [("p_eagle depth", "demo-peagle-depth", {"method": "p_eagle", "adaptive": False}),
        ("p_eagle standard", "demo-peagle-standard", {"method": "p_eagle", "adaptive": False}),
        ("vLLM parallel (standard head)", "demo-peagle-standard", {"method": "eagle3", "parallel_drafting": True}),
        ("vLLM eagle3 (eagle3 head)", "demo-eagle3", {"method": "eagle3"})]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ks", type=int, nargs="*", default=[8, 16, 32])
    p.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 1.0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--json")
    p.add_argument("--only", nargs="*", help="run names containing any of these words (default: all)")
    args = p.parse_args()
    set_cpu_defaults()
    from peagle_vllm.harness.corpus import held_out_prompts

    prompts = held_out_prompts(args.prompts, seed=0)
    rows = []
    print("| method | K | T | acceptance length | per-position acceptance |\n|---|---|---|---|---|")
    for name, head, spec in RUNS:
        if args.only and not any(w in name for w in args.only):
            continue
        for k in args.ks:
            for t in args.temperatures:
                cfg = {**spec, "model": str(REPO / "models" / head), "num_speculative_tokens": k}
                r = generate(str(REPO / "models" / "demo-target"), cfg, prompts, args.max_tokens, temperature=t, seed=0)
                rows.append({"method": name, "k": k, "temperature": t, "acceptance_length": r.spec.acceptance_length,
                             "per_position": r.spec.per_position_rate})
                pp = " ".join(f"{x:.2f}" for x in r.spec.per_position_rate)
                print(f"| {name} | {k} | {t:g} | {r.spec.acceptance_length:.2f} | {pp} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
