"""Lookups chained with the depth head, offline: the steps of the target's greedy outputs on the 64 held-out
prompts replayed as in `results/corpus-lookup-s61/corpus_offline.py` (the shipped depth head's recorded drafts,
prompt lookup then corpus lookup over datasets/smollm2), with the drafts of each step made two ways:
- first found: the lookups' continuation of the text at the first depths, the head's drafts at the rest (as before);
- chained (`peagle_vllm.lookup.chain`): depth by depth, the lookups' continuation of the text and the drafts so
  far where they find one, else the head's draft at that depth, which only the first `head depth` depths have.
Prints a markdown table of tokens per step (accepted drafts + 1) and drafts verified per step. Run from the
repository root:

    PYTHONPATH=. .venv/bin/python results/chain-lookup-s62/chain_offline.py
"""
import statistics
import sys
from pathlib import Path

import numpy as np

from peagle_vllm.corpus_lookup import CorpusLookup, read_answers
from peagle_vllm.lookup import FirstFound, PromptLookup, chain

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "corpus-lookup-s61"))
from corpus_offline import DATASETS, ROWS, SETS, accepted  # noqa: E402 (the same steps, corpus and rule)


def first_found(lookup, text: np.ndarray, head: list[int], k: int) -> list[int]:
    found = lookup.continuation(text, k).tolist()
    return found + head[len(found):k]


def replay(lookup, k: int, head_depth: int, chained: bool, rows=ROWS) -> tuple[float, float]:
    """(mean tokens per step, mean drafts verified per step) over `rows`."""
    per_step, verified = [], []
    for r in rows:
        out, t = r["out_ids"], 1
        while t < len(out):
            text, head = np.array(r["prompt_ids"] + out[:t]), r["head_drafts"][t - 1][:head_depth]
            drafts = chain(lookup, text, head, k)[0] if chained else first_found(lookup, text, head, k)
            a = accepted(drafts, out, t)
            per_step.append(a + 1)
            verified.append(len(drafts))
            t += a + 1
    return statistics.mean(per_step), statistics.mean(verified)


if __name__ == "__main__":
    lookup = FirstFound((PromptLookup(2, 5), CorpusLookup([a for s in SETS for a in read_answers(DATASETS / s)])))
    print(f"{len(ROWS)} held-out prompts x 128 greedy tokens; tokens per step (drafts verified per step)\n")
    print("| drafts | K | head depth | all 64 prompts | prompts 1-32 | prompts 1-16 |\n|---|---|---|---|---|---|")
    for chained, k, depth in ((False, 4, 4), (False, 8, 8), (True, 3, 3), (True, 4, 2), (True, 4, 3), (True, 4, 4),
                              (True, 5, 3), (True, 6, 3), (True, 8, 2), (True, 8, 8), (True, 12, 2)):
        cells = [replay(lookup, k, depth, chained, rows) for rows in (ROWS, ROWS[:32], ROWS[:16])]
        print(f"| {'chained' if chained else 'first found'} | {k} | {depth} | "
              + " | ".join(f"{a:.3f} ({v:.2f})" for a, v in cells) + " |")
