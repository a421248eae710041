"""The adaptive-depth controller's options: bounds on K, its trials' and explorations' spacing and length, and the
weights of its acceptance estimates."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DepthOptions:
    max_k: int
    min_k: int = 0
    probe_every: int = 16  # fewest steps between two probes (near ties); at most 64x as many
    probe_k: int = 2
    probe_steps: int = 4  # steady speculative steps a probe (a trial of speculation) times
    alone_trial_steps: int = 16  # the same for a new request's own trial, alone in its batch
    explore_every: int = 128  # plain steps are forced this often while speculating
    explore_steps: int = 4  # plain steps an exploration forces
    depth_explore_every: int = 32  # at batch 1, steps between two explorations of a depth beside the chosen one
    decay: float = 0.9  # weight of the past per observation (per request)
    prior_weight: float = 2.0  # pseudo-observations of the global prior in each request's estimate
    batch_prior_weight: float = 8.0  # the same in a batch of more than one request (`Acceptance`)

    def __post_init__(self) -> None:
        if not 0 <= self.min_k <= self.max_k:
            raise ValueError(f"min_k must lie in 0..max_k ({self.max_k}), got {self.min_k}")
