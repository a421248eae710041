"""Build the demo models from scratch on this CPU: the target (tokenizer + small Llama) and the heads.

    python scripts/build_demo_models.py --stage target   # about 70 min on 2 cores
    python scripts/build_demo_models.py --stage heads    # three heads, about 15 min each

Deterministic from --seed. Results go to models/ (shipped in the repository); caches and resumable
checkpoints to --work (default .cache/demo-build), so a killed build continues where it stopped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from peagle_vllm.harness.demo_target import TargetRecipe, build_target

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["target", "heads", "all"], default="all")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "demo-build")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=TargetRecipe.steps)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heads", nargs="*", help="only these heads (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.stage in ("target", "all"):
        recipe = TargetRecipe(seed=args.seed, steps=args.target_steps)
        report = build_target(args.models / "demo-target", args.work, recipe)
        print(f"target: {report['parameters']:,} parameters, held-out loss {report['final_held_out_loss']:.3f}")
    if args.stage in ("heads", "all"):
        from peagle_vllm.train.demo_heads import build_demo_heads

        build_demo_heads(args.models, args.work, seed=args.seed, only=args.heads)


if __name__ == "__main__":
    main()
