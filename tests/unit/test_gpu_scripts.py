"""The GPU scripts run end to end on this CPU at small sizes, so a session lent a GPU finds them working:
`scripts/gpu_bench.py` (the draft's cost table) and `scripts/gpu_core_check.py` (host syncs, memory, graphs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--device", "cpu", "--hidden", "256", "--draft-vocab", "1024", "--context", "64"]


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_gpu_bench_prints_its_four_tables(tmp_path: Path) -> None:
    answers = [{"prompt_ids": [1, 2], "response_ids": [3, 4, 5, 3, 4, 6]}, {"prompt_ids": [2], "response_ids": [3, 4]}]
    (tmp_path / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    out = _run("gpu_bench.py", *SMALL, "--vocab", "4096", "--heads", "2", "--kv-heads", "1", "--batches", "1", "2",
               "--ks", "1", "4", "--lookup-lengths", "256", "1024", "--corpus", str(tmp_path), "--corpus-ks", "4")
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    # batch x K drafting rows, one verify row per batch, batch x history length prompt lookup rows, then batch x K
    # corpus walk rows
    assert len(rows) == 2 * 2 + 2 + 2 * 2 + 2, out
    assert rows[-3].startswith("| 2 | 1024 | ") and rows[-1].startswith("| 2 | 4 | ")


def test_gpu_core_check_reports_every_check(tmp_path: Path) -> None:
    out = _run("gpu_core_check.py", *SMALL, "--vocab", "4096", "--batch", "8", "--mem-batch", "2", "--out",
               str(tmp_path))
    report = json.loads((tmp_path / "gpu_core_check.json").read_text())
    assert "all checks passed" in out
    assert set(report["no_host_sync"].values()) == {"no sync"} and len(report["no_host_sync"]) == 10
    for mode in ("standard", "block"):  # the counter saw verification's own tensors (none on a CUDA allocator here)
        assert report["memory"][mode]["counted_gib"] > 0 and report["memory"][mode]["measured_gib"] is None
    assert {"b1_k8", "b1_k32", "b64_k8"} == set(report["graphs"]) and report["graphs"]["b1_k8"]["eager_ms"] > 0
