"""Training layout for all K depths in one forward, with Conditional Drop-token (COD) sampling.

For a window of T captured positions, depth-0 slot j is (token x_{j+1}, fc(h_j)) at position j and
predicts x_{j+2}; depth-d slot of anchor j is (mask token, mask state d) at position j+d and predicts
x_{j+d+2}. Depth d keeps a fraction max(r^d, r_min) of anchors, nested (one uniform per anchor),
so a kept slot always has every shallower slot of its anchor, exactly as at inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SlotLayout:
    anchor: torch.Tensor  # [S] anchor position j of each slot
    depth: torch.Tensor  # [S] 0 = real token, d >= 1 = d-th mask slot
    attend: torch.Tensor  # [S, S] bool, query slot may attend key slot

    @property
    def positions(self) -> torch.Tensor:
        return self.anchor + self.depth

    @property
    def target_index(self) -> torch.Tensor:
        """Index of the target logits row each slot learns from (position j+d+1)."""
        return self.anchor + self.depth + 1


def keep_fraction(depth: int, r: float, r_min: float) -> float:
    return 1.0 if depth == 0 else max(r**depth, r_min)


def build_layout(num_positions: int, k: int, r: float = 0.7, r_min: float = 0.2,
                 generator: torch.Generator | None = None) -> SlotLayout:
    """Slots for a window whose target logits cover positions 0..num_positions-1 (T = num_positions)."""
    t = num_positions
    anchors0 = torch.arange(t - 1)  # depth-0 slot j needs logits at j+1
    u = torch.rand(t - 1, generator=generator)
    anchor, depth = [anchors0], [torch.zeros(t - 1, dtype=torch.long)]
    for d in range(1, k):
        ok = (anchors0 + d + 1 <= t - 1) & (u < keep_fraction(d, r, r_min))
        kept = anchors0[ok]
        anchor.append(kept)
        depth.append(torch.full_like(kept, d))
    a, dd = torch.cat(anchor), torch.cat(depth)
    real_key = (dd == 0).unsqueeze(0) & (a.unsqueeze(0) <= a.unsqueeze(1))
    own_mask_key = (dd.unsqueeze(0) > 0) & (a.unsqueeze(0) == a.unsqueeze(1)) & (dd.unsqueeze(0) <= dd.unsqueeze(1))
    attend = real_key | (own_mask_key & (dd.unsqueeze(1) > 0))
    return SlotLayout(a, dd, attend)
