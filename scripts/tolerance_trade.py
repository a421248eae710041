"""What lossy tolerance acceptance (`verifier_accept_k` x `accept_tolerance`) buys and costs, greedy, offline.

One vLLM engine per setting (p_eagle, fixed K, adaptive off) generates greedily for every prompt; the lossless
p_eagle run is the baseline. Per setting: tokens/s and speedup over lossless, acceptance length, the share of
prompts whose output is identical to the lossless one and the share of tokens identical up to each output's
first difference, the target's mean log-likelihood per output token (scored with transformers on the target,
after the prompt), and for prompts asking for Python code the share of closed ```python blocks that
`ast.parse` accepts. Writes tolerance_trade.md (a table), tolerance_trade.json and tolerance_trade.png
(speedup against exact-match rate) to --out.

    python scripts/tolerance_trade.py --out runs/tolerance-trade
    python scripts/tolerance_trade.py --target models/demo-target --draft models/demo-peagle-depth \\
        --accept-k 2 --tolerance 1 --max-tokens 8 --prompts 2 --out /tmp/trade
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from peagle_vllm.harness.prompts import EVAL_PROMPTS, chat_prompts, read_user_messages
from peagle_vllm.harness.runs import generate, quiet_vllm, set_cpu_defaults

REPO = Path(__file__).resolve().parent.parent

PYTHON_BLOCK = re.compile(r"```python[^\n]*\n(.*?)```", re.DOTALL)
CODE_ASK = re.compile(r"python|`|\b(function|class|script|program|command-line)\b", re.IGNORECASE)


@dataclass
class Row:
    setting: str
    accept_k: int
    tolerance: float
    tokens_per_s: float
    speedup: float
    acceptance_length: float
    exact_outputs: float  # share of prompts whose output equals the lossless one
    exact_prefix_tokens: float  # share of lossless tokens matched before each output's first difference
    mean_loglik: float  # the target's mean log-likelihood per output token
    python_parse: float | None  # share of closed ```python blocks that parse (None: no block)
    python_blocks: int


def wants_python(message: str) -> bool:
    """A prompt that asks for Python code: it names Python, a `code` span, or a function, class, script, program
    or command-line tool (outputs without a ```python block count for nothing)."""
    return bool(CODE_ASK.search(message))


def python_blocks(text: str) -> list[str]:
    """The closed ```python blocks of a text (an unclosed last block, cut by max_tokens, is left out)."""
    return PYTHON_BLOCK.findall(text)


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def mean_loglik(model, tokenizer, prompts: list[str], outputs: list[list[int]]) -> float:
    """The target's mean log-probability per output token, each output scored after its prompt."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            if not out:
                continue
            ids = tokenizer(prompt).input_ids + out
            logits = model(torch.tensor([ids])).logits[0, -len(out) - 1: -1].float()
            total += float(logits.log_softmax(-1).gather(1, torch.tensor(out).unsqueeze(1)).sum())
            count += len(out)
    return total / max(count, 1)


def spec(draft: str, k: int, accept_k: int = 1, tolerance: float = 0.0) -> dict:
    cfg = {"method": "p_eagle", "model": draft, "num_speculative_tokens": k, "adaptive": False}
    if accept_k > 1 or tolerance > 0:
        cfg.update(verifier_accept_k=accept_k, accept_tolerance=tolerance)
    return cfg


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for r in rows:
        ax.scatter(r.exact_outputs, r.speedup, color="black" if r.setting == "lossless" else "tab:blue")
        ax.annotate(r.setting, (r.exact_outputs, r.speedup), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("outputs identical to lossless (share of prompts)")
    ax.set_ylabel("speedup over lossless p_eagle (tokens/s)")
    ax.set_title("tolerance acceptance: speed against exactness (greedy)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(rows: list[Row]) -> str:
    lines = ["| setting | tokens/s | speedup | acceptance length | identical outputs | identical-prefix tokens "
             "| mean log-lik/token | python blocks parsing |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parse = "-" if r.python_parse is None else f"{r.python_parse:.0%} of {r.python_blocks}"
        lines.append(f"| {r.setting} | {r.tokens_per_s:.1f} | {r.speedup:.2f}x | {r.acceptance_length:.2f} | "
                     f"{r.exact_outputs:.0%} | {r.exact_prefix_tokens:.0%} | {r.mean_loglik:.3f} | {parse} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    p.add_argument("--draft", default=str(REPO / "models" / "smollm2-peagle-depth"), help="the p_eagle head")
    p.add_argument("--prompts-file", default=str(EVAL_PROMPTS), help="a JSON list of user messages")
    p.add_argument("--prompts", type=int, default=None, help="use the first N messages (default: all)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    p.add_argument("--accept-k", type=int, nargs="+", default=[2, 3, 5])
    p.add_argument("--tolerance", type=float, nargs="+", default=[0.5, 1.0, 2.0, 5.0])
    p.add_argument("--out", default=str(REPO / "runs" / "tolerance-trade"))
    args = p.parse_args()
    for flag, path in (("--target", args.target), ("--draft", args.draft)):
        if not Path(path).is_dir():
            sys.exit(f"{flag} {path}: no such model directory; pass an existing target / p_eagle head")
    if any(a < 2 for a in args.accept_k) or any(t <= 0 for t in args.tolerance):
        sys.exit("--accept-k values must be >= 2 and --tolerance values > 0 (smaller ones are the lossless baseline)")
    set_cpu_defaults()
    quiet_vllm()
    messages = read_user_messages(args.prompts_file)[: args.prompts]
    prompts = chat_prompts(args.target, messages)
    settings = [(1, 0.0)] + [(a, t) for a in args.accept_k for t in args.tolerance]
    runs = {}
    for accept_k, tol in settings:
        name = "lossless" if accept_k == 1 else f"k={accept_k} tol={tol:g}"
        print(f"{name}: generating {len(prompts)} x {args.max_tokens} tokens", flush=True)
        runs[name] = (accept_k, tol, generate(args.target, spec(args.draft, args.k, accept_k, tol), prompts,
                                              args.max_tokens, temperature=0.0))

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    base = runs["lossless"][2]
    code = [i for i, m in enumerate(messages) if wants_python(m)]
    rows = []
    for name, (accept_k, tol, run) in runs.items():
        same = [a == b for a, b in zip(run.token_ids, base.token_ids)]
        prefix = sum(common_prefix(a, b) for a, b in zip(run.token_ids, base.token_ids))
        blocks = [b for i in code for b in python_blocks(tokenizer.decode(run.token_ids[i], skip_special_tokens=True))]
        rows.append(Row(name, accept_k, tol, run.tokens_per_s, run.tokens_per_s / base.tokens_per_s,
                        run.spec.acceptance_length, sum(same) / len(same),
                        prefix / max(sum(len(b) for b in base.token_ids), 1),
                        mean_loglik(model, tokenizer, prompts, run.token_ids),
                        sum(map(parses, blocks)) / len(blocks) if blocks else None, len(blocks)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = (f"target {Path(args.target).name}, head {Path(args.draft).name}, K={args.k}, {len(prompts)} prompts ({len(code)} asking for "
              f"Python), {args.max_tokens} tokens, greedy\n\n")
    (out / "tolerance_trade.md").write_text(header + table(rows))
    (out / "tolerance_trade.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    plot(rows, out / "tolerance_trade.png")
    print(header + table(rows) + f"\nwritten to {out}")


if __name__ == "__main__":
    main()
