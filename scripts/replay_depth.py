"""Adaptive depth against every fixed K and plain decoding, replayed (`peagle_vllm.harness.depth_replay`): the
demo head's greedy acceptance on held-out prompts, step costs from the offline benchmark's cells, the
repository's controller. Seconds instead of the benchmark's half hour, and paired rounds on the same
noise, so differences of a percent or two show.

    python scripts/replay_depth.py                  # prints a markdown table, writes results/depth-replay/
    python scripts/replay_depth.py --build-runs     # first, or after retraining a demo model (1.5 min)
    python scripts/replay_depth.py --draft-cost 0.35  # a draft path at 0.35 of its cost here (a GPU-like case)
    python scripts/replay_depth.py --costs results/depth-replay/bench_costs_2026-12-02.json  # a later benchmark's

Acceptance runs: for every position of each prompt's greedy continuation by the target, how many drafts
in a row the head gets right when a step starts there (one head forward over all positions and depths,
the trainer's layout with every slot kept). Two prompt sets: the benchmark's 16 prompts, and 16 drawn
each round from 48 others (a check that a change does not only fit the benchmark's prompts).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from peagle_vllm.harness.bench import requests_for
from peagle_vllm.depth import DepthController, DepthOptions
from peagle_vllm.harness.depth_replay import HEAD_PROMPT_MS_PER_TOKEN, Noise, Request, StepCosts, replay

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "depth-replay"
RUNS = OUT / "acceptance_runs.json"
# the offline benchmark the step costs come from: results/bench-adaptive/bench.json of 3f9afe7 (session 10,
# 11 rounds), kept as a copy so that a later benchmark run, in a noisier spell of the machine, does not move
# the replay's costs unnoticed (replays before and after a change must price steps alike)
BENCH = OUT / "bench_costs.json"
# later ones, by date, for `--costs`: the machine's speed moves between days (no-spec at c=1 218 tokens/s in
# session 10, 104 on 2026-12-02), and with it whether speculation pays at c=1 (K=4 1.03x of plain, then 1.17x)
MAX_K = 32
NEW_TOKENS = 64  # the benchmark's max_tokens
PROMPT_SETS = {"benchmark prompts": (1, 16), "other prompts": (2, 48)}  # held_out_prompts(n, seed)
WARMUP = (4, 32)  # the benchmark's warm-up cell: concurrency, tokens


def build_runs() -> None:
    """Greedy acceptance runs of the demo depth head on both prompt sets, written to RUNS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from peagle_vllm.checkpoint import load_head
    from peagle_vllm.harness.corpus import held_out_prompts
    from peagle_vllm.train.data import capture
    from peagle_vllm.train.layout import build_layout
    from peagle_vllm.train.trainer import head_inputs

    models = REPO / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "demo-target")
    target = AutoModelForCausalLM.from_pretrained(models / "demo-target", dtype=torch.float32).eval()
    head = load_head(models / "demo-peagle-depth").eval()
    out: dict[str, dict] = {}
    for name, (seed, n) in PROMPT_SETS.items():
        out[name] = []
        for prompt in held_out_prompts(n, seed=seed):
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                extra = NEW_TOKENS + MAX_K + 2  # the last runs see MAX_K tokens ahead
                seq = target.generate(ids, max_new_tokens=extra, min_new_tokens=extra, do_sample=False)
                aux, logits = capture(target, seq, head.cfg.aux_layer_ids)
                layout = build_layout(seq.shape[1], MAX_K, r=1.0, r_min=1.0)  # every anchor, every depth
                slot_ids, hidden, positions = head_inputs(head, layout, seq, aux)
                normed, _ = head(slot_ids, hidden, positions, layout.attend.unsqueeze(0))
                drafts = head.draft_to_target()[head.draft_logits(normed).argmax(-1)][0]
            right = (drafts == logits[0].argmax(-1)[layout.target_index]).tolist()
            by_anchor: dict[int, dict[int, bool]] = {}
            for a, d, ok in zip(layout.anchor.tolist(), layout.depth.tolist(), right):
                by_anchor.setdefault(a, {})[d] = ok
            p0, runs = ids.shape[1], []
            for i in range(NEW_TOKENS):  # a step after generated token i (position p0 + i): anchor p0 + i - 1
                row, r = by_anchor[p0 + i - 1], 0
                while r < MAX_K and row[r]:
                    r += 1
                runs.append(r)
            out[name].append({"prompt_tokens": p0, "runs": runs})
            print(f"{name}: {len(out[name])}/{n}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    RUNS.write_text(json.dumps(out))


def step_costs(scale: float, bench: Path = BENCH) -> StepCosts:
    """Plain steps' and drafting's costs per batch size, from an offline benchmark's no-spec and fixed-K
    cells: a cell's mean step lasts concurrency x acceptance length / tokens per second."""
    rows = [r for r in json.loads(bench.read_text())["rows"] if r["interface"] == "offline" and r["temperature"] == 0]
    plain = {r["concurrency"]: 1e3 * r["concurrency"] / r["tokens_per_s"] for r in rows if r["mode"] == "no-spec"}
    extra: dict[int, list[tuple[float, float]]] = {}
    for r in sorted((r for r in rows if r["mode"] == "p_eagle-depth"), key=lambda r: r["k"]):
        c = r["concurrency"]
        ms = 1e3 * c * r["acceptance_length"] / r["tokens_per_s"]
        extra.setdefault(c, [(0.0, scale * (ms - plain[c]))]).append((2.0 * r["k"], scale * (ms - plain[c])))
    return StepCosts(plain, extra, scale * HEAD_PROMPT_MS_PER_TOKEN)


def cell(prompts: list[dict], concurrency: int, tag: str) -> list[Request]:
    """The benchmark's requests for one cell (`bench.requests_for`)."""
    chosen = requests_for(prompts, concurrency)
    return [Request(f"{tag}-{i}", p["prompt_tokens"], p["runs"]) for i, p in enumerate(chosen)]


def compare(prompts: list[dict], concurrency: int, rounds: int, costs: StepCosts, noise: dict,
            draw: int | None) -> dict[str, list[float]]:
    """Tokens/s per round of no speculation, each fixed K and adaptive depth (one controller kept over the
    rounds, after the benchmark's warm-up cell), every mode on the same noise in a round."""
    ctrl = DepthController(DepthOptions(max_k=MAX_K))
    replay(cell(prompts[:16], WARMUP[0], "warm"), WARMUP[0], costs, WARMUP[1], Noise(**noise, seed=10**6), ctrl)
    out: dict[str, list[float]] = {}
    for rnd in range(rounds):
        chosen = prompts if draw is None else random.Random(rnd).sample(prompts, draw)
        modes = {"no-spec": {}, **{f"K={k}": {"fixed_k": k} for k in (1, 2, 4, 8, 16, 32)},
                 "adaptive": {"controller": ctrl}}
        for name, kwargs in modes.items():
            requests = cell(chosen, concurrency, f"{rnd}")
            out.setdefault(name, []).append(replay(requests, concurrency, costs, NEW_TOKENS, Noise(**noise, seed=rnd),
                                                   **kwargs))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-runs", action="store_true", help="recompute the acceptance runs from the demo models")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4, 8, 16, 64])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--noise", type=float, default=0.05, help="sd of a step's time, relative")
    p.add_argument("--drift", type=float, default=0.15, help="sd of the machine's slow speed drift, on its log")
    p.add_argument("--draft-cost", type=float, default=1.0, help="scale of what drafting adds to a step")
    p.add_argument("--costs", type=Path, default=BENCH, help="the offline benchmark (bench.json) steps are priced by")
    args = p.parse_args()
    if args.build_runs or not RUNS.exists():
        build_runs()
    runs, costs = json.loads(RUNS.read_text()), step_costs(args.draft_cost, args.costs)
    noise = {"step": args.noise, "drift": args.drift}
    lines = ["| prompts | conc. | best fixed K | adaptive / best fixed | adaptive / no-spec "
             "| fixed K / no-spec (1 2 4 8 16 32) |", "|---|---|---|---|---|---|"]
    for name, prompts in runs.items():
        for c in args.concurrency:
            res = compare(prompts, c, args.rounds, costs, noise, None if name == "benchmark prompts" else 16)

            def ratio(a: str, b: str) -> float:
                return statistics.mean(x / y for x, y in zip(res[a], res[b]))

            fixed = [m for m in res if m.startswith("K=")]
            best = max(fixed, key=lambda m: ratio(m, "no-spec"))
            per_k = " ".join(f"{ratio(m, 'no-spec'):.2f}" for m in fixed)
            lines.append(f"| {name} | {c} | {best} | {ratio('adaptive', best):.3f} | "
                         f"{ratio('adaptive', 'no-spec'):.3f} | {per_k} |")
            print(lines[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.costs == BENCH else "-" + args.costs.stem.replace("bench_costs_", "costs-")) + \
        ("" if args.draft_cost == 1.0 else f"-draft-cost-{args.draft_cost:g}")
    (OUT / f"replay{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
