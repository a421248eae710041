"""Drawing distinct training prompts from weighted makers, the loop every prompt source shares."""

from __future__ import annotations

import random
from collections.abc import Callable


def draw_distinct(rng: random.Random, makers: list[tuple[float, Callable[[], str | None]]], count: int) -> list[str]:
    """`count` distinct messages in draw order: each draw picks a maker by its weight and calls it (None: no
    message). Refuses after `count * 50` draws, when the makers' combinations have run out."""
    weights = [weight for weight, _ in makers]
    seen: set[str] = set()
    out: list[str] = []
    for _ in range(count * 50):
        if len(out) == count:
            break
        message = rng.choices(makers, weights)[0][1]()
        if message and message not in seen:
            seen.add(message)
            out.append(message)
    if len(out) < count:
        raise ValueError(f"only {len(out)} distinct prompts could be built, {count} were asked for")
    return out
