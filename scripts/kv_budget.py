"""KV blocks held by each speculative method on the demo target, side by side in one run.

1. Peak and mean blocks in use with N concurrent requests at K (default 32 x K=32, block size 32):
   no speculation, vLLM's built-in parallel drafting (standard head), p_eagle fixed K and adaptive
   (depth head).
2. Under a fixed KV budget (--budget-blocks) with more requests than fit: the largest number of
   requests that ran at once, and preemptions.
Greedy outputs of every mode are checked equal to no speculation. Prints a markdown table and
writes JSON.

    python scripts/kv_budget.py --json results/kv-budget.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.kv_budget import run

REPO = Path(__file__).resolve().parent.parent


def modes(k: int) -> dict[str, dict | None]:
    models = REPO / "models"
    return {
        "no speculation": None,
        "vLLM parallel (standard head)": {"method": "eagle3", "parallel_drafting": True,
                                          "model": str(models / "demo-peagle-standard"), "num_speculative_tokens": k},
        "p_eagle fixed K (depth head)": {"method": "p_eagle", "adaptive": False,
                                         "model": str(models / "demo-peagle-depth"), "num_speculative_tokens": k},
        "p_eagle adaptive (depth head)": {"method": "p_eagle", "model": str(models / "demo-peagle-depth"),
                                          "num_speculative_tokens": k},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--budget-blocks", type=int, default=96, help="KV blocks in the fixed-budget run")
    p.add_argument("--budget-requests", type=int, default=64)
    p.add_argument("--json")
    args = p.parse_args()
    target = str(REPO / "models" / "demo-target")
    prompts = held_out_prompts(max(args.requests, args.budget_requests), seed=0, max_chars=900)
    rows, reference = [], {}
    for name, spec in tqdm(modes(args.k).items(), desc="modes"):
        free = run(target, spec, prompts[: args.requests], args.max_tokens, args.block_size)
        tight = run(target, spec, prompts[: args.budget_requests], args.max_tokens, args.block_size,
                    num_blocks=args.budget_blocks)
        reference.setdefault("free", free.token_ids)
        reference.setdefault("tight", tight.token_ids)
        rows.append({"mode": name, "requests": args.requests, "k": args.k, "free": free.summary(),
                     "budget": tight.summary(), "greedy_identical": free.token_ids == reference["free"]
                     and tight.token_ids == reference["tight"]})
    print(f"\n{args.requests} concurrent requests x {args.max_tokens} tokens, K={args.k}, block size {args.block_size}; "
          f"budget run: {args.budget_requests} requests in {args.budget_blocks} blocks\n")
    print("| mode | peak blocks | mean blocks | released early | budget: most running at once | budget: preemptions "
          "| greedy = plain |\n|---|---|---|---|---|---|---|")
    for r in rows:
        f, b = r["free"], r["budget"]
        print(f"| {r['mode']} | {f['peak_blocks']} | {f['mean_blocks']} | {f['released_early']} | "
              f"{b['peak_running']} | {b['preemptions']} | {r['greedy_identical']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
