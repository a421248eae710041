"""scripts/build_smollm2_heads.py keeps a finished distillation as committed data and restores it instead of
distilling again (a target-written one, its committed prompts), on the CPU trains no further than the first stage
sized for a GPU, and calibrates on prompts it trained no head on."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("build_smollm2_heads", REPO / "scripts" / "build_smollm2_heads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_finished_data_set_is_committed_gzipped_and_restored_as_distill_wrote_it(tmp_path: Path) -> None:
    from peagle_vllm.harness.distill import LOG, chunk_path
    from peagle_vllm.train.data import read_conversations

    build = _script()
    work, committed = tmp_path / "work" / "distill-b", tmp_path / "datasets" / "distill-b"
    work.mkdir(parents=True)
    rows = [{"prompt": f"p{i}", "temperature": 0.0, "prompt_ids": [1, i], "response_ids": [i, 2, 3], "finished": True}
            for i in range(4)]
    for c in range(2):
        chunk_path(work, c).write_text("".join(json.dumps(r) + "\n" for r in rows[2 * c:2 * c + 2]))
    (work / LOG).write_text(json.dumps({"tokens": 12, "seconds": 1.0, "rows": 4}))
    build._restore_or_keep(tmp_path / "work" / "partial", committed)  # nothing finished, nothing committed: no-op
    assert not committed.exists()
    build._restore_or_keep(work, committed)
    assert sorted(p.name for p in committed.iterdir()) == ["chunk-0000.jsonl.gz", "chunk-0001.jsonl.gz", LOG]
    fresh = tmp_path / "fresh" / "distill-b"
    build._restore_or_keep(fresh, committed)
    assert read_conversations(fresh) == rows and chunk_path(fresh, 1).exists()
    assert json.loads((fresh / LOG).read_text())["rows"] == 4


def test_on_the_cpu_the_build_stops_at_the_first_gpu_stage_with_one_line(smollm2, tmp_path: Path) -> None:
    """The shipped heads end where the GPU stages begin: on the CPU the build names the stage and the way to run
    it, before capturing or training anything."""
    import subprocess

    build = _script()
    shipped = json.loads((REPO / "models" / "smollm2-peagle-depth" / "train_log.json").read_text())["stages"][-1]["end"]
    first_gpu = next(s for s in build.STAGES if s.get("gpu"))
    assert all(not s.get("gpu") for s in build.STAGES if s["steps"] <= shipped) and first_gpu["steps"] > shipped
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "build_smollm2_heads.py"), "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"the stage to step {first_gpu['steps']} (64 conversations a step) is sized for a "
                                   "GPU: run with --device cuda (on a lent machine: scripts/lent_gpu_heads.sh)")
    assert not any(tmp_path.glob("*/capture-*"))


def test_on_the_cpu_a_build_trains_the_stages_before_the_first_gpu_stage_still_to_come() -> None:
    build = _script()
    stages = [dict(steps=4, data="a"), dict(steps=8, data="b"), dict(steps=16, data="c", batch_size=64, gpu=True),
              dict(steps=20, data="d")]
    refusal = "the stage to step 16 (64 conversations a step) is sized for a GPU: run with --device cuda"
    for done in (0, 4):
        kept, line = build.stages_to_train(stages, done, "cpu")
        assert kept == stages[:2] and line.startswith(refusal)
    assert build.stages_to_train(stages, 8, "cpu")[0] == stages[:2]  # nothing left before it: the build refuses
    assert build.stages_to_train(stages, 16, "cpu") == (stages, "")  # past every GPU stage
    assert build.stages_to_train(stages, 0, "cuda") == (stages, "")


def test_the_draft_temperature_is_calibrated_on_prompts_no_data_set_holds() -> None:
    from peagle_vllm.harness import calibrate
    from peagle_vllm.train.prompts import SOURCES, training_prompts

    build = _script()
    made = [*build.DATASETS.values(), *build.SHELVED.values()]
    assert set(calibrate.FIRST_UNTRAINED) == set(SOURCES)
    for source, start in calibrate.FIRST_UNTRAINED.items():
        ends = [spec["prompts"][1] for spec in made if spec.get("source", "templates") == source]
        calibration = training_prompts(start, start + calibrate.PROMPTS, source=source)
        assert start >= max(ends, default=0) and len(set(calibration)) == calibrate.PROMPTS, source


def test_a_target_written_data_set_answers_its_committed_prompts_which_obey_the_rules() -> None:
    from peagle_vllm.harness.user_turns import SOURCE, keep
    from peagle_vllm.train.prompts import EVAL_PROMPTS

    build = _script()
    made = {**build.DATASETS, **build.SHELVED}
    names = [name for name, spec in made.items() if spec.get("source") == SOURCE]
    assert names
    for name in names:
        prompts = json.loads((build.DATA_DIR / f"{name}-prompts.json").read_text())["prompts"]
        seen: set[str] = set()
        assert all(keep(p, seen, json.loads(EVAL_PROMPTS.read_text())) for p in prompts)
        rows = []
        for chunk in sorted((build.DATA_DIR / name).glob("chunk-*.jsonl.gz")):
            with gzip.open(chunk, "rt") as lines:
                rows += [json.loads(line)["prompt"] for line in lines]
        start, end = made[name]["prompts"]
        assert rows == prompts[start:end]
