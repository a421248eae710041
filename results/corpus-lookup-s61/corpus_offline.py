"""Corpus lookup beside prompt lookup and the depth head, offline: the steps of the target's greedy outputs on the 64
held-out prompts replayed as in `results/prompt-lookup-s60/lookup_offline.py` (its greedy_heads.json: the outputs
and the shipped depth head's drafts at every position), with drafts from prompt lookup (n >= 2), else from the
corpus (`peagle_vllm.corpus_lookup`, over the data sets of datasets/smollm2), else the head's. Prints markdown
tables (tokens per step = accepted drafts + 1, as the engine's acceptance length) and plots tokens per step
against the corpus's size. Run from the repository root:

    PYTHONPATH=. .venv/bin/python results/corpus-lookup-s61/corpus_offline.py
"""
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from peagle_vllm.corpus_lookup import CorpusLookup, read_answers
from peagle_vllm.lookup import FirstFound, PromptLookup

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "prompt-lookup-s60"))
from lookup_offline import accepted  # noqa: E402 (the same rule: drafts accepted up to the first mismatch)
ROWS = json.loads((HERE.parent / "prompt-lookup-s60" / "greedy_heads.json").read_text())
DATASETS = Path("datasets/smollm2")
# in the order they were distilled (datasets/smollm2/README.md)
SETS = ["distill-b", "distill-c", "distill-d", "distill-e", "distill-f", "distill-g", "requests", "questions",
        "requests-b", "user-turns"]


def replay(k: int, lookup) -> tuple[float, int, float]:
    """(mean tokens per step, steps, median lookup microseconds): the drafts at each step are the lookup's
    continuation (None: none) at the first depths, the head's at the rest."""
    per_step, spent = [], []
    for r in ROWS:
        out, t = r["out_ids"], 1
        while t < len(out):
            head = r["head_drafts"][t - 1][:k]
            found = []
            if lookup is not None:
                start = time.perf_counter()
                found = lookup.continuation(np.array(r["prompt_ids"] + out[:t]), k).tolist()
                spent.append(time.perf_counter() - start)
            a = accepted(found + head[len(found):], out, t)
            per_step.append(a + 1)
            t += a + 1
    return statistics.mean(per_step), len(per_step), statistics.median(spent) * 1e6 if spent else 0.0


if __name__ == "__main__":
    answers = {s: read_answers(DATASETS / s) for s in SETS}
    prompt = PromptLookup(2, 5)
    everything = [a for s in SETS for a in answers[s]]
    corpus = CorpusLookup(everything)
    print(f"{len(ROWS)} held-out prompts; corpus: {corpus.answers} answers, {corpus.tokens} tokens\n")
    print("| drafts | K=4 | K=6 | K=8 |\n|---|---|---|---|")
    for name, lookup in (("head alone", None), ("prompt lookup, else head", prompt),
                         ("corpus lookup, else head", corpus),
                         ("prompt lookup, else corpus lookup, else head", FirstFound((prompt, corpus)))):
        cells = [replay(k, lookup) for k in (4, 6, 8)]
        print(f"| {name} | " + " | ".join(f"{a:.3f} ({s} steps)" for a, s, _ in cells) + " |")
    print("\nK=4, prompt lookup then corpus lookup, by the walk's rules:\n")
    print("| shortest suffix | min product of frequencies | tokens per step | lookup us (median) |\n|---|---|---|---|")
    for min_n in (2, 3, 4):
        for min_prob in (0.3, 0.5, 0.7):
            a, _, us = replay(4, FirstFound((prompt, CorpusLookup(everything, min_n=min_n, min_prob=min_prob))))
            print(f"| {min_n} | {min_prob} | {a:.3f} | {us:.0f} |")
    print("\nK=4, prompt lookup then corpus lookup, by the corpus's size (data sets in the order distilled):\n")
    print("| data sets | answer tokens | tokens per step |\n|---|---|---|")
    sizes, rates = [0], [replay(4, prompt)[0]]
    for n in (1, 2, 4, 6, 8, 10):
        part = CorpusLookup([a for s in SETS[:n] for a in answers[s]])
        sizes.append(part.tokens)
        rates.append(replay(4, FirstFound((prompt, part)))[0])
        print(f"| {n} | {part.tokens} | {rates[-1]:.3f} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s / 1e6 for s in sizes], rates, marker="o")
    ax.set_xlabel("corpus: answer tokens (millions)")
    ax.set_ylabel("tokens per step, K=4")
    ax.set_title("Prompt lookup, then corpus lookup, then the depth head\n64 held-out prompts x 128 greedy tokens")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "tokens_per_step_by_corpus_size.png", dpi=120)
