"""`peagle-vllm calibrate-draft` end to end on the tiny demo models, and the written factor reaching the engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from peagle_vllm.checkpoint import read_head_config
from peagle_vllm.draft_temperature import SCALES
from peagle_vllm.harness.calibrate import write
from peagle_vllm.harness.runs import close_llm, make_llm


def _draft_temperature(worker) -> float:
    return worker.model_runner.drafter.model.draft_temperature


def test_calibration_records_drafts_picks_the_best_factor_and_writes_it(demo, tmp_path: Path) -> None:
    head = tmp_path / "head"
    shutil.copytree(demo["draft"], head)
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "calibrate-draft", "--json", "--write",
                          "--target", str(demo["target"]), "--draft", str(head), "--prompts", "4",
                          "--max-tokens", "32"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    scores = {float(s): v for s, v in report["expected_accepted"].items()}
    assert report["steps"] > 10 and set(scores) == set(SCALES)
    assert report["draft_temperature"] == max(scores, key=scores.get)
    assert 0 < scores[1.0] <= scores[report["draft_temperature"]] < report["k"]
    assert read_head_config(head).draft_temperature == report["draft_temperature"]
    write(str(head), 0.6)  # a head's own factor reaches the engine when the speculative config gives none
    llm = make_llm(str(demo["target"]), {"method": "p_eagle", "model": str(head), "num_speculative_tokens": 4})
    try:
        assert llm.collective_rpc(_draft_temperature) == [0.6]
    finally:
        close_llm(llm)


def test_a_missing_head_is_one_line(demo, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "calibrate-draft", "--target",
                          str(demo["target"]), "--draft", str(tmp_path / "nowhere")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "nowhere" in run.stderr
