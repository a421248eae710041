"""Adaptive speculation depth: each step, each request's K (0..K_max) from its measured acceptance and the measured
cost of a step, maximising expected emitted tokens per unit of step time; measured speeds have the last word
between speculating and plain decoding. No vLLM here: the adapter (`vllm_adapter/v1/scheduler_hook.py`) drives it.

Modules, each importing only those above it:
- `step`: `Step`, what the controller is told of each engine step;
- `options`: `DepthOptions`, the controller's bounds on K, the spacing of its trials, the weights of its estimates;
- `acceptance`: per-request, per-position acceptance estimates and the curves P_r(i) built from them;
- `cost`: the step-cost model, fitted online, with a measured factor per token count;
- `speeds`: measured tokens per request-second of plain and speculative steps, by batch-size bucket;
- `optimiser`: given the curves and the costs, the K of each request (no regime state);
- `probes`: when fallback tries speculation next, spaced by what a trial costs;
- `explore`: depth explorations at batch 1, which keep the token counts around the choice measured;
- `regime`: `DepthController`, the trials, fallback, explorations and reservations around the others;
- `hold`: `FallbackHold`, steady fallback's steps that skip the controller.
"""

from __future__ import annotations

from peagle_vllm.depth.acceptance import RESCALE, Counts, RequestStats
from peagle_vllm.depth.cost import CostModel
from peagle_vllm.depth.hold import HOLD_STEPS, FallbackHold
from peagle_vllm.depth.optimiser import REWEIGH_EVERY, REWEIGH_FROM
from peagle_vllm.depth.regime import DepthController, DepthOptions
from peagle_vllm.depth.step import Step

__all__ = ["HOLD_STEPS", "RESCALE", "REWEIGH_EVERY", "REWEIGH_FROM", "CostModel", "Counts", "DepthController",
           "DepthOptions", "FallbackHold", "RequestStats", "Step"]
