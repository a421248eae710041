"""Depth explorations (`peagle_vllm.depth.explore`): when they run, how long, and at which depth."""

from __future__ import annotations

from peagle_vllm.depth.cost import CostModel
from peagle_vllm.depth.explore import DepthExploration


def test_every_few_steps_the_depth_beside_the_choice_seen_least_runs_for_a_few_steps() -> None:
    """The optimiser's choice stands until `every` steps; then the neighbour whose token count the cost model saw
    least lately (here 3 drafts: 1 and 2 were seen) runs `steps` steps with every draft kept, then the choice again;
    at K_max only the depth below is explored, and a depth of 1 explores 2 (there is no depth 0 to draft)."""
    cost = CostModel()
    for _ in range(10):
        cost.observe(1, 2, 2, 0.03)  # steps verifying 1 draft (2 tokens)
        cost.observe(1, 3, 4, 0.03)  # and 2 drafts (3 tokens)
    exploration = DepthExploration(every=8, steps=2, max_k=3)
    chosen = [exploration.choose(step, 0.4, 2, cost) for step in range(1, 13)]
    assert chosen[:7] == [(0.4, 2)] * 7
    assert chosen[7:9] == [(0.0, 3)] * 2 and chosen[9:] == [(0.4, 2)] * 3
    assert [exploration.choose(step, 0.2, 3, cost) for step in (16, 17, 18)] == [(0.0, 2), (0.0, 2), (0.2, 3)]
    assert exploration.choose(24, 0.5, 1, cost) == (0.0, 2)
