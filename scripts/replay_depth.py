"""Adaptive depth against every fixed K and plain decoding, replayed (`peagle_vllm.harness.depth_replay`): the
depth head's greedy acceptance on held-out prompts (`--target`: the tiny demo, or SmolLM2-135M-Instruct), step
costs from the offline benchmark's cells, the repository's controller. Seconds instead of the benchmark's half
hour, and paired rounds on the same noise, so differences of a percent or two show.

    python scripts/replay_depth.py                  # prints a markdown table, writes results/depth-replay/
    python scripts/replay_depth.py --build-runs     # first, or after retraining a demo model (1.5 min)
    python scripts/replay_depth.py --draft-cost 0.35  # a draft path at 0.35 of its cost here (a GPU-like case)
    python scripts/replay_depth.py --costs results/depth-replay/bench_costs_2026-12-02.json  # a later benchmark's
    python scripts/replay_depth.py --target smollm2 --build-runs  # SmolLM2 (runs: some 8 min beside other work)

Acceptance runs: for every position of each prompt's greedy continuation by the target, how many drafts
in a row the head gets right when a step starts there (one head forward over all positions and depths,
the trainer's layout with every slot kept). Two prompt sets per target (`TARGETS`): the benchmark's prompts, and
some drawn each round from others (a check that a change does not only fit the benchmark's prompts).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peagle_vllm.harness.bench import requests_for
from peagle_vllm.depth import DepthController, DepthOptions
from peagle_vllm.harness.depth_replay import HEAD_PROMPT_MS_PER_TOKEN, Noise, Request, StepCosts, replay

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "depth-replay"
NEW_TOKENS = 64  # the benchmark's max_tokens
WARMUP = (4, 32)  # the benchmark's warm-up cell: concurrency, tokens


@dataclass(frozen=True)
class Target:
    """What a replay needs of one target: its models, the prompt sets its acceptance runs come from, the depths
    measured (`max_k`), the controller's K_max (the benchmark's adaptive K_max), the fixed K compared, and the
    offline benchmarks its step costs come from (`step_costs`)."""

    target: str  # under models/
    head: str  # the depth head, under models/
    max_k: int  # drafts in a row measured per position (the head's K)
    adaptive_k: int  # the controller's K_max
    fixed_ks: tuple[int, ...]
    # name -> (prompts, drawn per round: None for all of them in every round)
    prompt_sets: dict[str, tuple[Callable[[], list[str]], int | None]]
    runs: Path  # the acceptance runs, written by `build_runs`
    costs: Path  # the offline benchmark (bench.json) steps are priced by
    # benchmarks whose fixed-K cells add deeper K to `costs`', as ratios to their own no-spec cells
    deeper: tuple[Path, ...] = ()
    prefix: str = ""  # of the tables written


def _demo_prompts(seed: int, n: int) -> Callable[[], list[str]]:
    def prompts() -> list[str]:
        from peagle_vllm.harness.corpus import held_out_prompts

        return held_out_prompts(n, seed=seed)
    return prompts


def _smollm2_prompts(first: int, n: int) -> Callable[[], list[str]]:
    """Chat-template prompts of the held-out user messages first..first+n-1 (the benchmark's are the first 4)."""
    def prompts() -> list[str]:
        from peagle_vllm.harness.prompts import EVAL_PROMPTS, chat_prompts, read_user_messages

        messages = read_user_messages(EVAL_PROMPTS)[first:first + n]
        return chat_prompts(REPO / "models" / "SmolLM2-135M-Instruct", messages)
    return prompts


TARGETS = {
    # the offline benchmark the step costs come from: results/bench-adaptive/bench.json of 3f9afe7 (session 10,
    # 11 rounds), kept as a copy so that a later benchmark run, in a noisier spell of the machine, does not move
    # the replay's costs unnoticed (replays before and after a change must price steps alike); later ones, by
    # date, for `--costs`: the machine's speed moves between days (no-spec at c=1 218 tokens/s in session 10, 104
    # on 2026-12-02), and with it whether speculation pays at c=1 (K=4 1.03x of plain, then 1.17x)
    "demo": Target("demo-target", "demo-peagle-depth", 32, 32, (1, 2, 4, 8, 16, 32),
                   {"benchmark prompts": (_demo_prompts(1, 16), None), "other prompts": (_demo_prompts(2, 48), 16)},
                   OUT / "acceptance_runs.json", OUT / "bench_costs.json"),
    # SmolLM2-135M-Instruct with its depth head (K up to 16), the benchmark's adaptive K_max 8; the benchmark's 4
    # prompts, and 4 drawn each round from 16 other held-out messages; costs from a copy of
    # results/bench-smollm2-s48/bench.json (the eight-pass heads, K=1, 2 at c=1, 4 and 16; kept so that a later
    # benchmark does not move them unnoticed), deeper K at c=1 from results/bench-smollm2-k48-s48 (K=4, 8),
    # -k16-s48 (K=16) and -c1-k234-fresh-s48 (K=3), each priced against its own no-spec cell
    "smollm2": Target("SmolLM2-135M-Instruct", "smollm2-peagle-depth", 16, 8, (1, 2, 3, 4, 8, 16),
                      {"benchmark prompts": (_smollm2_prompts(0, 4), None),
                       "other prompts": (_smollm2_prompts(4, 16), 4)},
                      OUT / "smollm2_acceptance_runs.json", OUT / "smollm2_bench_costs_2026-12-05.json",
                      tuple(REPO / "results" / f"bench-smollm2-{run}" / "bench.json"
                            for run in ("k48-s48", "k16-s48", "c1-k234-fresh-s48")), "smollm2_"),
}


def build_runs(t: Target) -> None:
    """Greedy acceptance runs of the target's depth head on its prompt sets, written to `t.runs`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from peagle_vllm.checkpoint import load_head
    from peagle_vllm.train.data import capture
    from peagle_vllm.train.layout import build_layout
    from peagle_vllm.train.objective import head_inputs

    models = REPO / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / t.target)
    target = AutoModelForCausalLM.from_pretrained(models / t.target, dtype=torch.float32).eval()
    head = load_head(models / t.head, target_embeddings=target.get_input_embeddings().weight).eval()
    out: dict[str, list[dict]] = {}
    for name, (prompts, _) in t.prompt_sets.items():
        out[name] = []
        chosen = prompts()
        for prompt in chosen:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                extra = NEW_TOKENS + t.max_k + 2  # the last runs see max_k tokens ahead
                seq = target.generate(ids, max_new_tokens=extra, min_new_tokens=extra, do_sample=False)
                aux, logits = capture(target, seq, head.cfg.aux_layer_ids)
                layout = build_layout(seq.shape[1], t.max_k, r=1.0, r_min=1.0)  # every anchor, every depth
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
                while r < t.max_k and row[r]:
                    r += 1
                runs.append(r)
            out[name].append({"prompt_tokens": p0, "runs": runs})
            print(f"{name}: {len(out[name])}/{len(chosen)}", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    t.runs.write_text(json.dumps(out))


def _greedy_offline(bench: Path) -> list[dict]:
    return [r for r in json.loads(bench.read_text())["rows"] if r["interface"] == "offline" and r["temperature"] == 0]


def step_costs(scale: float, bench: Path, deeper: tuple[Path, ...] = ()) -> StepCosts:
    """Plain steps' and drafting's costs per batch size, from an offline benchmark's no-spec and fixed-K
    cells: a cell's mean step lasts concurrency x acceptance length / tokens per second. `deeper` benchmarks add
    the fixed K that `bench` lacks at a concurrency it has, each step priced as a ratio to its own benchmark's
    no-spec step. What drafting adds is at least 0, and otherwise as measured: it need not grow with K (this CPU's
    linear layers run some row counts faster than fewer rows)."""
    rows = _greedy_offline(bench)
    plain = {r["concurrency"]: 1e3 * r["concurrency"] / r["tokens_per_s"] for r in rows if r["mode"] == "no-spec"}
    ms_by_k: dict[int, dict[int, float]] = {}
    for r in rows:
        if r["mode"] == "p_eagle-depth":
            c = r["concurrency"]
            ms_by_k.setdefault(c, {})[r["k"]] = 1e3 * c * r["acceptance_length"] / r["tokens_per_s"]
    for path in deeper:
        more = _greedy_offline(path)
        own = {r["concurrency"]: r["tokens_per_s"] for r in more if r["mode"] == "no-spec"}
        for r in more:
            c = r["concurrency"]
            if r["mode"] == "p_eagle-depth" and c in plain and c in own and r["k"] not in ms_by_k.get(c, {}):
                ms_by_k.setdefault(c, {})[r["k"]] = plain[c] * r["acceptance_length"] * own[c] / r["tokens_per_s"]
    extra: dict[int, list[tuple[float, float]]] = {}
    for c, by_k in ms_by_k.items():
        for k in sorted(by_k):
            added = max(by_k[k] - plain[c], 0.0)
            extra.setdefault(c, [(0.0, scale * added)]).append((2.0 * k, scale * added))
    return StepCosts(plain, extra, scale * HEAD_PROMPT_MS_PER_TOKEN)


def cell(prompts: list[dict], concurrency: int, tag: str) -> list[Request]:
    """The benchmark's requests for one cell (`bench.requests_for`)."""
    chosen = requests_for(prompts, concurrency)
    return [Request(f"{tag}-{i}", p["prompt_tokens"], p["runs"]) for i, p in enumerate(chosen)]


def compare(t: Target, prompts: list[dict], concurrency: int, rounds: int, costs: StepCosts, noise: dict,
            draw: int | None) -> dict[str, list[float]]:
    """Tokens/s per round of no speculation, each fixed K and adaptive depth (one controller kept over the
    rounds, after the benchmark's warm-up cell), every mode on the same noise in a round."""
    ctrl = DepthController(DepthOptions(max_k=t.adaptive_k))
    replay(cell(prompts[:16], WARMUP[0], "warm"), WARMUP[0], costs, WARMUP[1], Noise(**noise, seed=10**6), ctrl)
    out: dict[str, list[float]] = {}
    for rnd in range(rounds):
        chosen = prompts if draw is None else random.Random(rnd).sample(prompts, draw)
        modes = {"no-spec": {}, **{f"K={k}": {"fixed_k": k} for k in t.fixed_ks}, "adaptive": {"controller": ctrl}}
        for name, kwargs in modes.items():
            requests = cell(chosen, concurrency, f"{rnd}")
            out.setdefault(name, []).append(replay(requests, concurrency, costs, NEW_TOKENS, Noise(**noise, seed=rnd),
                                                   **kwargs))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=sorted(TARGETS), default="demo")
    p.add_argument("--build-runs", action="store_true", help="recompute the acceptance runs from the target's models")
    p.add_argument("--concurrency", type=int, nargs="*", default=None,
                   help="default: 1 2 4 8 16 64 (demo), 1 4 (smollm2, the benchmark's)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--noise", type=float, default=0.05, help="sd of a step's time, relative")
    p.add_argument("--drift", type=float, default=0.15, help="sd of the machine's slow speed drift, on its log")
    p.add_argument("--draft-cost", type=float, default=1.0, help="scale of what drafting adds to a step")
    p.add_argument("--costs", type=Path, default=None,
                   help="the offline benchmark (bench.json) steps are priced by (default: the target's)")
    args = p.parse_args()
    t = TARGETS[args.target]
    concurrencies = args.concurrency or ([1, 2, 4, 8, 16, 64] if args.target == "demo" else [1, 4])
    if args.build_runs or not t.runs.exists():
        build_runs(t)
    bench = args.costs or t.costs
    costs = step_costs(args.draft_cost, bench, t.deeper if bench == t.costs else ())
    runs = json.loads(t.runs.read_text())
    noise = {"step": args.noise, "drift": args.drift}
    lines = ["| prompts | conc. | best fixed K | adaptive / best fixed | adaptive / no-spec "
             f"| fixed K / no-spec ({' '.join(map(str, t.fixed_ks))}) |", "|---|---|---|---|---|---|"]
    for name, prompts in runs.items():
        for c in concurrencies:
            res = compare(t, prompts, c, args.rounds, costs, noise, t.prompt_sets[name][1])

            def ratio(a: str, b: str) -> float:
                return statistics.mean(x / y for x, y in zip(res[a], res[b]))

            fixed = [m for m in res if m.startswith("K=")]
            best = max(fixed, key=lambda m: ratio(m, "no-spec"))
            per_k = " ".join(f"{ratio(m, 'no-spec'):.2f}" for m in fixed)
            lines.append(f"| {name} | {c} | {best} | {ratio('adaptive', best):.3f} | "
                         f"{ratio('adaptive', 'no-spec'):.3f} | {per_k} |")
            print(lines[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = ("" if bench == t.costs else "-" + bench.stem.replace("bench_costs_", "costs-")) + \
        ("" if args.draft_cost == 1.0 else f"-draft-cost-{args.draft_cost:g}") + \
        ("" if (args.noise, args.drift) == (0.05, 0.15) else f"-noise-{args.noise:g}-drift-{args.drift:g}")
    (OUT / f"{t.prefix}replay{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
