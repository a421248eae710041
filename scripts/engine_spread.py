"""How far apart identical offline engines in one process run: N engines of one mode, built one after the
other as `peagle-vllm bench` builds them, each measured on the benchmark's c=1 cell in every round (the order
rotated each round). An engine whose median stays off the others' in every round carries its own speed for its
whole life, which rounds over the same engines cannot average out (hence `bench --fresh-engines`).

    python scripts/engine_spread.py [--engines 10] [--rounds 4] [--out results/engine-spread/spread.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from peagle_vllm.harness.runs import close_llm, quiet_vllm, set_cpu_defaults

TARGET = Path("models/SmolLM2-135M-Instruct")
SPEC = {"method": "p_eagle", "model": "models/smollm2-peagle-depth", "num_speculative_tokens": 2, "adaptive": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_cpu_defaults()
    quiet_vllm()
    from peagle_vllm.harness.bench import _measure, _warm_engine
    from peagle_vllm.harness.prompts import eval_prompts

    prompts = eval_prompts(TARGET, args.prompts, seed=1)  # the benchmark's prompts
    engines = [_warm_engine(TARGET, SPEC, 1, prompts) for _ in range(args.engines)]
    rounds: list[list[float]] = [[] for _ in engines]  # tokens/s per engine (in build order), per round
    for r in range(args.rounds):
        turn = r % len(engines)
        for i in list(range(turn, len(engines))) + list(range(turn)):
            rounds[i].append(_measure(engines[i], prompts, 1, args.max_tokens, 0.0)["tokens_per_s"])
        print(f"round {r + 1}: " + " ".join(f"{engine[-1]:.1f}" for engine in rounds), flush=True)
    for llm in engines:
        close_llm(llm)
    medians = [statistics.median(engine) for engine in rounds]
    print("medians (build order): " + " ".join(f"{m:.1f}" for m in medians)
          + f"; fastest / slowest {max(medians) / min(medians):.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"spec": SPEC, "prompts": args.prompts, "max_tokens": args.max_tokens,
                                        "tokens_per_s_by_engine": rounds, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
