"""`peagle-vllm distill --source user-turns` on the tiny target: the target writes the user messages (kept by
harness/user_turns.py's rules, in OUT/user_turns.json), then answers them; a second run reuses both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from peagle_vllm.harness.user_turns import keep
from peagle_vllm.train.prompts import EVAL_PROMPTS


def _distill(target: Path, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "distill", "--target", str(target), "--out",
                           str(out), "--source", "user-turns", "--prompts", "12", "--max-tokens", "8"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_distill_answers_messages_the_target_wrote(tiny, tmp_path: Path) -> None:
    out = tmp_path / "turns"
    first = _distill(tiny["target"], out)
    turns = json.loads((out / "user_turns.json").read_text())
    prompts = turns["prompts"][:12]
    seen: set[str] = set()
    assert len(prompts) == 12 and all(keep(p, seen, json.loads(EVAL_PROMPTS.read_text())) for p in prompts)
    rows = [json.loads(line) for chunk in sorted(out.glob("chunk-*.jsonl")) for line in chunk.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == prompts and first["rows"] == 12
    again = _distill(tiny["target"], out)
    assert again == first and json.loads((out / "user_turns.json").read_text()) == turns
