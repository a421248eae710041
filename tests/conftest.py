"""Shared fixtures: random tiny models in a temp dir, the shipped demo models, CPU settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
REPO = Path(__file__).resolve().parent.parent
DEMO_TARGET = REPO / "models" / "demo-target"
DEMO_DRAFT = REPO / "models" / "demo-peagle-depth"
SMOLLM2_DRAFT = REPO / "models" / "smollm2-peagle-depth"

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Random tiny target (4 layers) with standard and depth heads, and a depth head of two decoder layers."""
    from tiny_models import build_random_head, build_tiny_target

    root = tmp_path_factory.mktemp("tiny")
    target = build_tiny_target(root / "target")
    return {
        "target": target,
        "head": build_random_head(target, root / "head", k=8),
        "depth": build_random_head(target, root / "depth", variant="depth", k=32, draft_vocab=256),
        "two_layer": build_random_head(target, root / "two_layer", variant="depth", k=8, draft_vocab=256, layers=2),
        "root": root,
    }


@pytest.fixture(scope="session")
def demo() -> dict[str, Path]:
    if not (DEMO_TARGET / "config.json").exists() or not (DEMO_DRAFT / "config.json").exists():
        pytest.fail("the shipped demo models are missing: run `python scripts/build_demo_models.py`")
    return {"target": DEMO_TARGET, "draft": DEMO_DRAFT}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The converted SmolLM2-135M-Instruct (made by scripts/setup.sh), its shipped depth head present."""
    from peagle_vllm.harness.real_target import DEFAULT_DIR, RealTargetError, check_converted

    try:
        target = check_converted(DEFAULT_DIR)
    except RealTargetError as exc:
        pytest.fail(str(exc))
    if not (SMOLLM2_DRAFT / "config.json").exists():
        pytest.fail(f"{SMOLLM2_DRAFT} is missing: run `python scripts/build_smollm2_heads.py`")
    return target
