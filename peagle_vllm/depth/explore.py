"""Depth explorations at batch 1: every `every` speculative steps the depth beside the chosen one runs for `steps`
steps. A step's cost is not linear in its tokens (on this CPU a step of 2 tokens costs more than one of 3 to 5), and
the cost model measures a token count's own factor (`CostModel.token_factors`) only where a depth runs: without
them the choice stays where the linear fit put it."""

from __future__ import annotations

from peagle_vllm.depth.cost import CostModel


class DepthExploration:
    """When a depth exploration runs and at which depth: of the two beside the chosen one, the one whose token count
    the cost model saw least lately."""

    __slots__ = ("every", "steps", "max_k", "left", "depth", "next_at")

    def __init__(self, every: int, steps: int, max_k: int) -> None:
        self.every, self.steps, self.max_k = every, steps, max_k
        self.left = 0  # steps still to run at the explored depth
        self.depth = 0  # the depth explored
        self.next_at = every  # controller step of the next exploration

    def choose(self, step: int, threshold: float, depth: int, cost: CostModel) -> tuple[float, int]:
        """(threshold, depth) for a speculative step at batch 1 outside trials: the optimiser's, or in an exploration
        every draft up to the depth explored."""
        if not self.left and step >= self.next_at:
            self.next_at = step + self.every
            beside = [d for d in (depth - 1, depth + 1) if 1 <= d <= self.max_k]
            if beside:
                seen = cost.token_weights()
                self.depth = min(beside, key=lambda d: seen.get(1 + d, 0.0))
                self.left = self.steps
        if not self.left:
            return threshold, depth
        self.left -= 1
        return 0.0, self.depth
