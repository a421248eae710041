"""The demo heads for models/demo-target, trained by our trainer on the target's own continuations of
the corpus's train split: `depth` (ours, K=32, the demo's default draft), `standard` (the published
P-EAGLE head, loads in vLLM's built-in parallel drafting too) and `eagle3` (sequential baseline).
Each head runs its phases in order (a later phase resumes the run with a longer cosine schedule)."""

from __future__ import annotations

import shutil
from pathlib import Path

from peagle_vllm.train.trainer import STATE_DIR, TrainRecipe, train

# name -> (variant, steps of each phase)
HEADS = {"demo-peagle-depth": ("depth", [500, 1200, 3000]), "demo-peagle-standard": ("standard", [500]),
         "demo-eagle3": ("eagle3", [500])}
DEMO_RECIPE = dict(k=32, batch_size=8, seq_len=128, lr=3e-3, draft_vocab=2048, aux_layer_ids=[1, 2, 3],
                   self_distill=True, distill_pool=2048)


def build_demo_heads(models: Path, work: Path, seed: int = 0, only: list[str] | None = None) -> None:
    """Trains each head into work/<name> (resumable) and copies the export to models/<name>."""
    data = work / "train.npy"  # the target build's tokenised train split
    if not data.exists():
        raise FileNotFoundError(f"{data} is missing: run the target stage first (it tokenises the corpus)")
    for name, (variant, phases) in HEADS.items():
        if only and name not in only:
            continue
        run = work / name
        for steps in phases:
            recipe = TrainRecipe(target=str(models / "demo-target"), data=str(data), out=str(run), variant=variant,
                                 seed=seed, steps=steps, **DEMO_RECIPE)
            train(recipe, resume=run.exists())
        shutil.rmtree(models / name, ignore_errors=True)
        shutil.copytree(run, models / name, ignore=shutil.ignore_patterns(STATE_DIR))
