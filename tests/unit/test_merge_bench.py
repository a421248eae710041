"""scripts/merge_bench.py: every row is paired with its own run's no speculation, and overlapping runs are refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _merge_bench():
    spec = importlib.util.spec_from_file_location("merge_bench", REPO / "scripts" / "merge_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(mode: str, k: int, rounds: list[float], concurrency: int = 1, temperature: float = 0.0) -> dict:
    return {"interface": "offline", "mode": mode, "k": k, "concurrency": concurrency, "temperature": temperature,
            "tokens_per_s": sorted(rounds)[(len(rounds) - 1) // 2], "acceptance_length": 1.5 if k else 1.0,
            "per_position": [0.5] * k, "rounds_tokens_per_s": rounds}


def _run(root: Path, name: str, rows: list[dict]) -> Path:
    (root / name).mkdir()
    (root / name / "bench.json").write_text(json.dumps({"meta": {}, "rows": rows}))
    return root / name


def test_rows_are_paired_with_their_own_runs_no_speculation(tmp_path):
    merge = _merge_bench()
    fast = _run(tmp_path, "fast", [_row("no-spec", 0, [40.0, 20.0, 40.0]), _row("p_eagle-depth", 2, [60.0, 30.0, 60.0]),
                                   _row("p_eagle-depth", 2, [99.0] * 3, concurrency=4)])
    slow = _run(tmp_path, "slow", [_row("no-spec", 0, [10.0, 10.0, 10.0]), _row("p_eagle-depth", 8, [12.0, 11.0, 13.0])])
    rows = merge.merged_rows([fast, slow], concurrency=1)
    assert [(r["k"], r["run"], r["paired_vs_no_spec"]) for r in rows] == [(2, "fast", 1.5), (8, "slow", 1.2)]


def test_a_mode_and_k_in_two_runs_is_refused(tmp_path):
    merge = _merge_bench()
    a = _run(tmp_path, "a", [_row("no-spec", 0, [10.0, 10.0]), _row("vllm-parallel", 2, [12.0, 12.0])])
    b = _run(tmp_path, "b", [_row("no-spec", 0, [10.0, 10.0]), _row("vllm-parallel", 2, [13.0, 13.0])])
    with pytest.raises(SystemExit, match="vllm-parallel K=2 T=0 is in both a and b"):
        merge.merged_rows([a, b], concurrency=1)


def test_a_run_of_one_round_is_refused(tmp_path):
    merge = _merge_bench()
    once = _run(tmp_path, "once", [_row("no-spec", 0, [10.0]), _row("p_eagle-depth", 2, [12.0])])
    with pytest.raises(SystemExit, match="once has no rounds to pair"):
        merge.merged_rows([once], concurrency=1)


def test_writes_table_json_and_plots(tmp_path, monkeypatch, capsys):
    merge = _merge_bench()
    run = _run(tmp_path, "run", [_row("no-spec", 0, [10.0, 10.0]), _row("p_eagle-standard", 4, [15.0, 14.0])])
    monkeypatch.setattr("sys.argv", ["merge_bench", "--runs", str(run), "--out", str(tmp_path / "out")])
    merge.main()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["by_k.json", "by_k.md", "per_position_acceptance.png", "speedup_vs_k.png"]
    assert "| offline | 0 | p_eagle-standard | 4 | 14.0 | 1.50 | 1.45 | run |" in capsys.readouterr().out
