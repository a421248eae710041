"""`peagle-vllm demo` end to end on the tiny demo models: --json, the screen, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def test_demo_json_reports_speed_acceptance_and_losslessness(demo) -> None:
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "demo", "--json", "--prompts", "6",
                          "--max-tokens", "48", "--k", "8", "--fixed-k", "--target", str(demo["target"]),
                          "--concurrency", "1", "4", "--prompt-lookup", "5"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["greedy_identical"] is True
    assert report["acceptance_length"] > 1.0
    assert len(report["per_position_acceptance"]) == 8
    assert set(report["tokens_per_s"]) == {"no_spec", "p_eagle"} and report["speedup"] > 0
    assert Path(report["target"]).is_absolute() and Path(report["draft"]) == demo["draft"].resolve()
    assert report["drafting"] is True and report["mean_latency_s"]["p_eagle"] > 0
    assert report["prompt_lookup_max"] == 5 and report["lookup_corpus"] is None  # only the lookup named
    assert 0 < report["lookup_draft_share"] < 1  # the tiny target's answers repeat their own text, not only that
    assert set(report["by_concurrency"]) == {"1", "4"}
    four = report["by_concurrency"]["4"]
    assert four["requests"] == 8 and four["greedy_identical"] is True  # two requests per slot at c=4


def test_demo_screen_says_in_words_when_no_draft_was_verified() -> None:
    """Adaptive depth in fallback for a whole cell: the screen says so instead of an acceptance of 1.00."""
    from peagle_vllm.harness.demo import render

    report = {"target": "t", "draft": "d", "k": 8, "adaptive": True, "prompts": 2, "max_tokens": 8,
              "by_concurrency": {"1": {"requests": 2, "tokens_per_s": {"no_spec": 10.0, "p_eagle": 9.9},
                                       "mean_latency_s": {"no_spec": 1.0, "p_eagle": 1.01}, "speedup": 0.99,
                                       "acceptance_length": 1.0, "per_position_acceptance": [0.0] * 8,
                                       "steps_verified": 0, "drafting": False, "greedy_identical": True}}}
    screen = render(report)
    assert "no drafts were verified" in screen and "acceptance length" not in screen
    report["by_concurrency"]["1"].update(drafting=True, steps_verified=5, acceptance_length=2.5)
    assert "acceptance length 2.50" in render(report) and "prompt lookup" not in render(report)
    assert "adaptive depth, prompt lookup of n-grams up to 5" in render({**report, "prompt_lookup_max": 5})
    assert "adaptive depth, corpus lookup from answers/" in render({**report, "lookup_corpus": "answers/"})
    assert "the head's drafts at the first 2 depths only" in render({**report, "head_depth": 2})
    assert "drafts verified" not in render(report)  # lookups off
    report["by_concurrency"]["1"]["lookup_draft_share"] = 0.43
    assert "drafts verified: 43% from the lookups, the rest from the head" in render(report)


def test_the_demo_drafts_with_a_shipped_targets_lookups_unless_told_otherwise() -> None:
    from peagle_vllm.config import PEagleConfigError
    from peagle_vllm.harness.demo import demo_lookups
    from peagle_vllm.harness.real_target import CORPORA, DEFAULT_DIR

    assert demo_lookups(DEFAULT_DIR, None, None, head_only=False) == (5, str(CORPORA[DEFAULT_DIR.name]))
    assert Path(CORPORA[DEFAULT_DIR.name], "README.md").is_file()  # the corpus ships with the project
    assert demo_lookups(DEFAULT_DIR, None, None, head_only=True) == (None, None)
    assert demo_lookups(DEFAULT_DIR, 3, None, head_only=False) == (3, None)
    assert demo_lookups(DEFAULT_DIR, None, "answers/", head_only=False) == (None, "answers/")
    assert demo_lookups(Path("models/demo-target"), None, None, head_only=False) == (None, None)  # no corpus
    with pytest.raises(PEagleConfigError, match="--head-only runs no lookup"):
        demo_lookups(DEFAULT_DIR, 5, None, head_only=True)


def test_a_bad_prompts_file_is_one_line_naming_it(demo, tmp_path: Path) -> None:
    bad = tmp_path / "prompts.json"
    bad.write_text('{"not": "a list"}')
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "demo", "--target", str(demo["target"]),
                          "--prompts-file", str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"peagle-vllm: error: --prompts-file {bad} must hold a non-empty JSON "
                                               'list of non-empty strings (user messages), e.g. ["Write a haiku.", '
                                               '"What is 2+2?"]']


def test_a_head_depth_without_a_lookup_is_one_line_naming_it(demo) -> None:
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "demo", "--target", str(demo["target"]),
                          "--head-depth", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert "speculative_config['head_depth'] needs prompt_lookup_max or lookup_corpus" in line
    assert line.endswith("(set by --k, --prompt-lookup, --lookup-corpus, --head-depth, --head-only)")
