"""The demo corpus: Python's own standard-library source, which exists on every machine offline.

Files are split deterministically into train and held-out by a hash of their relative path, so the
target, the heads and every acceptance figure use the same split on any machine.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

HELD_OUT_PER_MILLE = 40  # 4% of the files are held out for evaluation


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def _is_held_out(rel: str) -> bool:
    digest = hashlib.sha256(rel.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < HELD_OUT_PER_MILLE


def corpus_files(split: str, root: Path | None = None) -> list[Path]:
    """Sorted .py files of the stdlib (no site-packages) in `split` ("train" or "held_out")."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        if _is_held_out(rel) == (split == "held_out"):
            files.append(path)
    return files


def read_text(path: Path) -> str:
    """File text, undecodable bytes replaced (a few stdlib test files are not UTF-8)."""
    return path.read_bytes().decode("utf-8", errors="replace")


def held_out_prompts(n: int, min_chars: int = 120, max_chars: int = 600, seed: int = 0) -> list[str]:
    """`n` prompts of mixed lengths cut at line boundaries from held-out files, deterministically."""
    import random

    rng = random.Random(seed)
    files = corpus_files("held_out")
    prompts: list[str] = []
    attempts = 0
    while len(prompts) < n and attempts < 50 * n:
        attempts += 1
        lines = read_text(rng.choice(files)).splitlines(keepends=True)
        if len(lines) < 20:
            continue
        start = rng.randrange(0, len(lines) - 10)
        want = rng.randint(min_chars, max_chars)
        text = ""
        for line in lines[start:]:
            if len(text) + len(line) > want and text:
                break
            text += line
        if len(text.strip()) >= min_chars // 2:
            prompts.append(text)
    return prompts
