"""`peagle-vllm bench` end to end on the tiny demo models: the screen is the table, vLLM's logs only on --verbose."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _bench(demo, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """`peagle-vllm bench` on the tiny demo models: no speculation and the depth head at K=2, one short c=1 cell."""
    return subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "bench", "--target", str(demo["target"]),
                           "--modes", "no-spec", "p_eagle-depth", "--k", "2", "--concurrency", "1", "--temperature",
                           "0", "--prompts", "2", "--max-tokens", "8", "--interface", "offline", "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=600)


def test_bench_screen_is_its_table_and_files_without_vllm_logs(demo, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run = _bench(demo, out)
    assert run.returncode == 0, run.stderr[-3000:]
    screen = run.stdout + run.stderr
    assert " INFO " not in screen and "Loading safetensors" not in screen, screen[:2000]
    # vLLM's import-time warnings (before its logger is configured) and torch's C++ ones stay off it too
    assert "Triton is installed" not in screen and "] Warning:" not in screen, screen[:2000]
    assert "| offline | p_eagle-depth | 2 | 1 |" in run.stdout and f"written: {out}/bench.md" in run.stdout
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert {(r["mode"], r["k"]) for r in rows} == {("no-spec", 0), ("p_eagle-depth", 2)}


def test_bench_fresh_engines_measures_every_round_with_engines_built_for_it(demo, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run = _bench(demo, out, "--rounds", "2", "--fresh-engines")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert result["meta"]["fresh_engines"] is True and result["meta"]["rounds"] == 2
    rows = {(r["mode"], r["k"]): r for r in result["rows"]}
    assert set(rows) == {("no-spec", 0), ("p_eagle-depth", 2)}
    assert all(len(r["rounds_tokens_per_s"]) == 2 and r["tokens_per_s"] > 0 for r in rows.values())
    assert rows[("p_eagle-depth", 2)]["acceptance_length"] > 1.0  # the head drafted in the measured rounds
