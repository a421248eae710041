"""`peagle-vllm demo --json` end to end on the shipped demo models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_demo_json_reports_speed_acceptance_and_losslessness(demo) -> None:
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "demo", "--json", "--prompts", "6",
                          "--max-tokens", "48", "--k", "8", "--fixed-k"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["greedy_identical"] is True
    assert report["acceptance_length"] > 1.0
    assert len(report["per_position_acceptance"]) == 8
    assert set(report["tokens_per_s"]) == {"no_spec", "p_eagle"} and report["speedup"] > 0
    assert Path(report["target"]).is_absolute() and Path(report["draft"]) == demo["draft"].resolve()
