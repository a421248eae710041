"""Acceptance figures on vLLM 0.34, from the one hook V2 gives a speculator after each verification:
`DraftModelSpeculator.observe_verification(idx_mapping, num_sampled, num_rejected)`.

Rules:
- A request that had d drafts verified this step has num_sampled = a + 1 and num_rejected = d - a, a its
  accepted drafts; a request still prefilling has num_sampled = 0 and counts for nothing.
- Counts stay on the device (no sync per step); every WINDOW steps they are read once and fed, step by step,
  into the core's `AcceptanceMonitor` (block acceptance over the last WINDOW steps, warning below
  `acceptance_warn_below`), and a `p_eagle metrics:` line is logged with the per-position acceptance (and, with
  a lookup on, the drafts the lookups gave so far).
- What V2 lacks: a way to carry a worker's own figures to the API server. vLLM's own spec-decode counters
  (`vllm:spec_decode_*`) still count (the scheduler computes them), but our `peagle:*` Prometheus series are
  not served on 0.34; these figures reach the log only.
"""

from __future__ import annotations

import logging

import torch

from peagle_vllm.metrics import WINDOW, AcceptanceMonitor
from peagle_vllm.vllm_adapter.log import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


class VerificationCounts:
    """Per-step and per-position acceptance counts, kept on `device`, flushed every `window` steps."""

    def __init__(self, k: int, device: torch.device | str, warn_below: float, window: int = WINDOW) -> None:
        self.k = k
        self.monitor = AcceptanceMonitor(warn_below, window)
        self.steps = torch.zeros(window, 3, dtype=torch.long, device=device)  # drafting requests, drafted, accepted
        self.accepted_per_position = torch.zeros(k, dtype=torch.long, device=device)
        self.drafted_per_position = torch.zeros(k, dtype=torch.long, device=device)
        self.lookup_drafts = torch.zeros((), dtype=torch.long, device=device)  # drafts the lookups gave, so far
        self.num_steps = 0
        self.last_window_rate: float | None = None

    def count_lookup(self, taken: torch.Tensor) -> None:
        """taken [B, k] bool: the drafts a lookup gave this step (`batch_lookup.lookup_first`)."""
        self.lookup_drafts += taken.sum()

    def observe(self, num_sampled: torch.Tensor, num_rejected: torch.Tensor) -> None:
        """num_sampled, num_rejected [B] of the step just verified."""
        accepted = (num_sampled.long() - 1).clamp(min=0)
        drafted = torch.where(num_sampled > 0, accepted + num_rejected.long(), 0)
        row = torch.stack([(drafted > 0).sum(), drafted.sum(), accepted.sum()])
        self.steps[self.num_steps % self.steps.shape[0]] = row
        cols = torch.arange(self.k, device=accepted.device)
        self.accepted_per_position += (cols < accepted.unsqueeze(1)).sum(0)
        self.drafted_per_position += (cols < drafted.unsqueeze(1)).sum(0)
        self.num_steps += 1
        if self.num_steps % self.steps.shape[0] == 0:
            self.flush()

    def flush(self) -> None:
        """Reads the counts once (one device sync) and reports them."""
        figures = None
        for num_drafts, drafted, accepted in self.steps.tolist():
            figures = self.monitor.observe(num_drafts, drafted, accepted) or figures
            if figures is not None and figures.warning:
                logger.warning(figures.warning)
        if figures is None:
            return
        self.last_window_rate = figures.window_rate
        acc, drafted = self.accepted_per_position.tolist(), self.drafted_per_position.tolist()
        per_position = " ".join(f"{a / d:.2f}" if d else "-" for a, d in zip(acc, drafted))
        looked_up = int(self.lookup_drafts)
        logger.info("p_eagle metrics: block acceptance %.1f%% over the last %d steps, acceptance length %.2f, "
                    "acceptance by position %s%s", 100 * figures.window_rate, len(self.monitor.window),
                    figures.acceptance_length, per_position,
                    f"; drafts from lookups so far: {looked_up}" if looked_up else "")
