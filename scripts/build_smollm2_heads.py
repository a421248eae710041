"""Train the shipped heads for SmolLM2-135M-Instruct, with equal budgets (same data, tokens, steps):
`smollm2-peagle-depth` (ours, K=16), `smollm2-peagle-standard` (the published P-EAGLE layout, K=16; also loads
in vLLM's built-in parallel drafting) and `smollm2-eagle3` (sequential EAGLE-3 baseline).

    python scripts/build_smollm2_heads.py                  # every phase; rerun it to resume after an interruption
    python scripts/build_smollm2_heads.py --device cuda    # the same on a GPU (scripts/lent_gpu_heads.sh)
    python scripts/build_smollm2_heads.py --distill-only   # only distill the data sets the stages to come read

Phases, each resumable: self-distillation (the target answers a data set's training prompts, chunk by chunk),
the capture of the target's states (once per data set, shared by the three heads), then each head's training
(checkpointed every few steps) in STAGES: passes over a data set, each with its own learning-rate schedule,
precision, batch size and weighting of the loss by draft depth. Every head finishes a stage before any head starts
the next, so an interrupted build leaves heads with equal budgets; on the CPU the build stops, with one line, where
the first stage marked `gpu` begins. Work goes to --work (default runs/smollm2-heads); when a stage ends, the heads
are copied to models/ (weights, config, train_log.json, loss.png, without the trainer's state), and a comparison
plot of the three runs to models/smollm2-heads-loss.png. The P-EAGLE heads in models/ then get their draft
temperature for sampled requests (`peagle-vllm calibrate-draft --write`, which needs vLLM: without it, one line says
to run that later).
Wall time per phase is appended to --work/phases.json.

A head in models/ whose stages end where the next stage begins continues from its exported weights with a fresh
optimizer (the trainer's state does not outlive --work). Distilled data sets are committed in DATA_DIR (token
ids, gzipped) and restored from there, so a rebuild skips their self-distillation.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "models" / "SmolLM2-135M-Instruct"
HEADS = {"smollm2-peagle-depth": "depth", "smollm2-peagle-standard": "standard", "smollm2-eagle3": "eagle3"}
DATA_DIR = REPO / "datasets" / "smollm2"
# Data sets: which of training_prompts' prompts each one answers (from its `source`, default the templates; source
# "user-turns": messages the target writes itself, harness/user_turns.py, kept in DATA_DIR/<name>-prompts.json), and
# the precision of its capture.
DATASETS = {"distill": dict(prompts=(0, 3072), capture="float32"),
            "distill-b": dict(prompts=(3072, 6144), capture="bfloat16"),
            "distill-c": dict(prompts=(6144, 9216), capture="bfloat16"),
            "distill-d": dict(prompts=(9216, 12288), capture="bfloat16"),
            "distill-e": dict(prompts=(12288, 15360), capture="bfloat16"),
            "distill-f": dict(prompts=(15360, 18432), capture="bfloat16"),
            "requests": dict(source="requests", prompts=(0, 3072), capture="bfloat16"),
            "questions": dict(source="questions", prompts=(0, 3072), capture="bfloat16")}
# Data sets committed in DATA_DIR that no stage reads: a pass over each gave no held-out acceptance
# (docs/smollm2-heads.md). Moved into DATASETS, one becomes a stage again.
SHELVED = {"distill-g": dict(prompts=(18432, 21504), capture="bfloat16"),
           "requests-b": dict(source="requests", prompts=(3072, 6144), capture="bfloat16"),
           "user-turns": dict(source="user-turns", prompts=(0, 2560), capture="bfloat16")}
RECIPE = dict(k=16, seq_len=384, warmup=20, draft_vocab=8192, share_embeddings=True, checkpoint_every=16)
# Each stage ends at step `steps`, with its own warmup and cosine decay to zero from `lr`. The CPU stages are one pass
# each (a data set's conversations, 8 a step: 384 steps for 3,072): two over the first data set, then one over each
# other. The `gpu` stages that follow are two passes each (64 conversations a step: 96 steps for 3,072) over data sets
# the heads have seen, sized for a GPU, where such a step costs 0.1-0.3 s (H200); a new data set goes in before them
# (passes over new prompts raise acceptance, repeats barely). Stages peak at PEAK_LR for the first EARLY_PASSES passes
# and at LATE_LR after them: from a head this far along, a peak of PEAK_LR first undoes what it learnt
# (docs/smollm2-heads.md). Depth d's loss weighs DECAY**d for the first DECAY_PASSES passes and LATE_DECAY**d after
# them: the late passes spend more of the head on the first drafts, which acceptance needs most.
PEAK_LR, LATE_LR, EARLY_PASSES = 2e-3, 5e-4, 6
DECAY, LATE_DECAY, DECAY_PASSES = 0.8, 0.5, 8
LATER_SETS = list(DATASETS)[1:]
CPU_PASSES = ["distill", "distill", *LATER_SETS]


def _pass_steps(data: str, batch_size: int) -> int:
    start, end = DATASETS[data]["prompts"]
    return (end - start) // batch_size


CPU_ENDS = list(itertools.accumulate(_pass_steps(data, 8) for data in CPU_PASSES))
GPU_ENDS = list(itertools.accumulate((2 * _pass_steps(data, 64) for data in LATER_SETS), initial=CPU_ENDS[-1]))[1:]
STAGES = [*[dict(steps=CPU_ENDS[i], precision="float32" if i == 0 else "bfloat16", data=data,
                 lr=PEAK_LR if i < EARLY_PASSES else LATE_LR, depth_decay=DECAY if i < DECAY_PASSES else LATE_DECAY)
             for i, data in enumerate(CPU_PASSES)],
          *[dict(steps=GPU_ENDS[i], precision="bfloat16", data=data, lr=LATE_LR, depth_decay=LATE_DECAY,
                 batch_size=64, gpu=True) for i, data in enumerate(LATER_SETS)]]
LAST_STEPS = 16  # the plot's agreement by depth: mean of the last steps (one batch alone is noisy)


def _record(work: Path, phase: str, seconds: float, accumulate: bool = False, **extra) -> None:
    """One entry per phase in work/phases.json: replaced, or with `accumulate` its seconds added to (a resumed
    phase that only measures its own call)."""
    path = work / "phases.json"
    phases = {p["phase"]: p for p in json.loads(path.read_text())} if path.exists() else {}
    before = phases.get(phase, {}).get("seconds", 0.0) if accumulate else 0.0
    phases[phase] = {"phase": phase, "seconds": round(before + seconds, 1), **extra}
    path.write_text(json.dumps(list(phases.values()), indent=1))


def _restore_or_keep(work_data: Path, committed: Path) -> None:
    """Copies a committed data set (chunk-NNNN.jsonl.gz) into `work_data` as distill() writes it, or, when
    `work_data` is complete and nothing is committed yet, commits it (gzipped)."""
    from peagle_vllm.harness.distill import LOG

    if committed.is_dir() and not (work_data / LOG).exists():
        work_data.mkdir(parents=True, exist_ok=True)
        for chunk in sorted(committed.glob("chunk-*.jsonl.gz")):
            (work_data / chunk.name.removesuffix(".gz")).write_bytes(gzip.decompress(chunk.read_bytes()))
        shutil.copy(committed / LOG, work_data / LOG)
    elif not committed.is_dir() and (work_data / LOG).exists():
        tmp = committed.with_name(committed.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for chunk in sorted(work_data.glob("chunk-*.jsonl")):
            (tmp / (chunk.name + ".gz")).write_bytes(gzip.compress(chunk.read_bytes(), mtime=0))
        shutil.copy(work_data / LOG, tmp / LOG)
        tmp.replace(committed)


def _prompts(name: str, spec: dict) -> list[str]:
    """The training prompts a data set answers: built by its source, or written by the target (user turns)."""
    from peagle_vllm.harness import user_turns as turns
    from peagle_vllm.train.prompts import training_prompts

    start, end = spec["prompts"]
    if spec.get("source") == turns.SOURCE:
        return turns.user_turns(str(TARGET), DATA_DIR / f"{name}-prompts.json", end)[start:]
    return training_prompts(start, end, source=spec.get("source", "templates"))


def stages_to_train(stages: list[dict], done: int, device: str) -> tuple[list[dict], str]:
    """The stages a build on `device` may train once the heads have `done` steps (on the CPU, those before the
    first GPU stage still to come), and the line that refuses that GPU stage ("" when none is cut off)."""
    gpu_stage = next((s for s in stages if s["steps"] > done and s.get("gpu")), None)
    if gpu_stage is None or device != "cpu":
        return stages, ""
    return stages[:stages.index(gpu_stage)], (
        f"the stage to step {gpu_stage['steps']} ({gpu_stage['batch_size']} conversations a step) is sized for a GPU: "
        "run with --device cuda (on a lent machine: scripts/lent_gpu_heads.sh)")


def _planned_steps(run: Path) -> int:
    """Where the run's latest stage ends (0 for a new run): the trainer's state while it is unfinished, else
    its train_log.json."""
    from peagle_vllm.train.trainer import LOG_FILE, STATE_DIR, STATE_FILE

    if (run / STATE_DIR / STATE_FILE).exists():
        return torch.load(run / STATE_DIR / STATE_FILE, weights_only=False)["stages"][-1]["end"]
    log = run / LOG_FILE
    return json.loads(log.read_text())["stages"][-1]["end"] if log.exists() else 0


def _calibrate(work: Path, heads: list[Path]) -> None:
    """Each P-EAGLE head's draft temperature into its config.json (`harness.calibrate`, as calibrate-draft does),
    its engines under the CLI's CPU settings: a KV cache of 1 GiB, where vLLM's default asks for 92% of the
    machine's memory, more than is free beside a build holding its training data."""
    from peagle_vllm.harness.runs import quiet_vllm, set_cpu_defaults

    set_cpu_defaults()
    quiet_vllm()
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("no vLLM here: run `peagle-vllm calibrate-draft --draft HEAD --write` for " + ", ".join(map(str, heads)))
        return
    from peagle_vllm.harness import calibrate

    prompts = calibrate.calibration_prompts(TARGET)
    for head in heads:
        t0 = time.time()
        report = calibrate.run(str(TARGET), str(head), prompts)
        calibrate.write(str(head), report["draft_temperature"])
        _record(work, f"draft temperature {head.name}", time.time() - t0, factor=report["draft_temperature"])


def _plot(models: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    marked = set()  # (where, decay) of each change of depth weights, written once for all heads
    for name in HEADS:
        log = models / name / "train_log.json"
        if not log.exists():
            continue
        run = json.loads(log.read_text())
        history = run["history"]
        a.plot([h["tokens"] for h in history], [h["loss"] for h in history], label=name, lw=0.8)
        decay = run["stages"][0].get("depth_decay", DECAY)
        for stage in run["stages"][1:]:  # where a new pass with its own schedule starts
            where = history[stage["start"]]["tokens"]
            a.axvline(where, color="grey", lw=0.5, ls="--")
            if stage.get("depth_decay", DECAY) != decay:
                decay = stage["depth_decay"]
                if (where, decay) not in marked:
                    marked.add((where, decay))
                    a.text(where, 0.98, f" depth d\n weighs {decay}^d", transform=a.get_xaxis_transform(),
                           fontsize=7, va="top")
        last = history[-LAST_STEPS:]
        depths = sorted({int(d) for h in last for d in h["accuracy"]})
        b.plot([d + 1 for d in depths], [np.mean([h["accuracy"][str(d)] for h in last if str(d) in h["accuracy"]])
                                         for d in depths], marker="o", label=name)
    a.set_xlabel("training tokens (response tokens labelled)"), a.set_ylabel("KL(target || draft), depth-weighted")
    a.set_yscale("log"), a.legend(), a.set_title("loss (dashed: a new pass over the data)")
    b.set_xlabel("draft position"), b.set_ylabel(f"top-1 agreement with the target (last {LAST_STEPS} steps)")
    b.legend()
    b.set_title("agreement by depth")
    fig.tight_layout()
    fig.savefig(models / "smollm2-heads-loss.png", dpi=80)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "smollm2-heads")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--heads", nargs="*", default=list(HEADS), help="which heads (default: all three)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="where the capture and training run (cpu, cuda)")
    parser.add_argument("--distill-only", action="store_true",
                        help="only distill (and commit) the data sets the stages to come read; no capture, no training")
    args = parser.parse_args()
    from peagle_vllm.harness.distill import LOG, distill
    from peagle_vllm.harness.real_target import check_converted
    from peagle_vllm.train.capture import cache_dir_for, capture_conversations
    from peagle_vllm.train.data import read_conversations
    from peagle_vllm.train.trainer import STATE_DIR, TrainRecipe, default_aux_layers, train

    check_converted(TARGET)
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    aux = default_aux_layers(json.loads((TARGET / "config.json").read_text())["num_hidden_layers"])
    done = {name: _planned_steps(args.models / name) for name in args.heads}
    least = min(done.values())  # the stage after it is the first any head still needs
    stages, gpu_refusal = stages_to_train(STAGES, least, args.device)
    if gpu_refusal and not args.distill_only and not any(s["steps"] > least for s in stages):
        raise SystemExit(gpu_refusal)
    needed = [s["data"] for s in (STAGES if args.distill_only else stages) if s["steps"] > least]
    for name in dict.fromkeys(needed):  # each data set the remaining stages read, in order
        data, spec = args.work / name, DATASETS[name]
        _restore_or_keep(data, DATA_DIR / name)
        if (DATA_DIR / name).is_dir():  # restored: distilled before, no target run needed
            record = json.loads((data / LOG).read_text())
        else:
            record = distill(str(TARGET), _prompts(name, spec), data)
            _restore_or_keep(data, DATA_DIR / name)
        _record(args.work, f"self-distillation {name}", record["seconds"], tokens=record["tokens"],
                conversations=record["rows"])
        if args.distill_only:
            continue
        t0 = time.time()
        capture_conversations(str(TARGET), read_conversations(data), cache_dir_for(data, aux), aux,
                              precision=spec["capture"], device=args.device)
        _record(args.work, f"capture {name}", time.time() - t0, accumulate=True, precision=spec["capture"])
    if args.distill_only:
        return
    first = {}  # each head's first stage to train: the stage in progress, else the one after what models/ has
    for name in args.heads:
        run = args.work / name
        planned = _planned_steps(run)
        if planned > STAGES[-1]["steps"]:
            raise SystemExit(f"{run} holds a stage to step {planned}, beyond STAGES (to {STAGES[-1]['steps']}): "
                             "add that stage to STAGES to finish it, or remove the run to start over")
        if done[name] not in [0, *[s["steps"] for s in STAGES]]:
            raise SystemExit(f"{args.models / name} ends at step {done[name]}, where no stage of STAGES ends: remove "
                             "it to train the head from the start")
        first[name] = max(planned, done[name] + 1)
    for stage in stages:
        heads = [name for name in args.heads if stage["steps"] >= first[name]]
        for name in heads:
            run = args.work / name
            init_from = args.models / name if not run.exists() and done[name] else None
            recipe = TrainRecipe(target=str(TARGET), data=str(args.work / stage["data"]), out=str(run),
                                 variant=HEADS[name], **RECIPE, lr=stage["lr"], batch_size=stage.get("batch_size", 8),
                                 steps=stage["steps"], precision=stage["precision"], depth_decay=stage["depth_decay"],
                                 device=args.device)
            last = train(recipe, resume=run.exists(), init_from=str(init_from) if init_from else None)
            _record(args.work, name, last["seconds"], tokens=last["tokens"], steps=last["step"])
        for name in heads:  # every head has this stage: ship them together
            shutil.rmtree(args.models / name, ignore_errors=True)
            shutil.copytree(args.work / name, args.models / name, ignore=shutil.ignore_patterns(STATE_DIR))
        if heads:
            _plot(args.models)
            _calibrate(args.work, [args.models / name for name in heads if HEADS[name] != "eagle3"])
    if gpu_refusal:
        raise SystemExit(f"the CPU stages are done; {gpu_refusal}")


if __name__ == "__main__":
    main()
