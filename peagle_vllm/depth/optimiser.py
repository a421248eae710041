"""The draft-set optimiser: given a batch's acceptance curves and the fitted step costs, the K of each request that
maximises expected emitted tokens per second of the next step.

A step over B requests that verifies V drafts and drafts D rows (the head runs over every request of the step, as
deep as its deepest draft) costs (s0 + sb B + sv V + s2 D) f(B + V), f the measured factor of a step computing that
many tokens (1 where none is measured yet); a plain step (nothing drafted, nothing verified) costs
p0 + sb B. It emits B tokens plus the sum of P_r(i) over the drafts kept. D follows the deepest draft, so at each
depth d the best drafts are those at most d deep whose P reaches a threshold (P falls with i): the pair (d,
threshold) with the most tokens per second is chosen, or a plain step when that is faster.
"""

from __future__ import annotations

import numpy as np

from peagle_vllm.depth.acceptance import Curves
from peagle_vllm.depth.cost import CostModel

# a batch of REWEIGH_FROM requests or more keeps its weighing's threshold and depth for REWEIGH_EVERY steps
REWEIGH_EVERY, REWEIGH_FROM = 4, 4


def best_drafts(curves: Curves, costs: tuple[float, float, float, float, float], lookahead_rows: list[int],
                speculate: bool, factors: dict[int, float] | None = None) -> tuple[float, int]:
    """(threshold, depth): keep the drafts at most `depth` deep whose acceptance probability reaches `threshold`,
    the pair maximising expected tokens per predicted second; (inf, 0) is a plain step, no candidate when
    `speculate`. `costs`: `CostModel.terms()`; `lookahead_rows[d]`: draft rows per request of a step whose deepest
    draft is d; `factors`: `CostModel.token_factors()`, which scale each candidate's predicted seconds.

    At each depth d the draft cost is fixed and the best drafts within it lie above a threshold: Dinkelbach's
    iteration finds them (the drafts with P >= sv S have the most tokens - S seconds of any set; while their speed
    beats S, it is the next S). Each depth is weighed only for what it may add to the best speed so far (the drafts
    reaching sv times it), and the weighing stops at the first depth none reaches (P falls with depth); curves are
    computed depth by depth, only for requests whose draft before reached that bar. Weighing every depth, not only
    the top-n drafts overall (whose deepest, often one easy request's, would set every request's draft rows), lets
    a batch draft shallow where one request alone would take it deep."""
    b, factors = len(curves.values), factors or {}
    if b == 1:
        return _best_depth_alone(curves, costs, lookahead_rows, speculate, factors)
    s0, sb, sv, s2, plain = costs
    lookahead, per_request = lookahead_rows, sb * b
    best, threshold, depth = (-np.inf, np.inf, 0) if speculate else (b / max(plain + per_request, 1e-9), np.inf, 0)
    # the likeliest draft (a first one) alone: the best there is where each draft costs more than it yields
    top = max(curve[0] for curve in curves.values)
    one = (b + top) / max((s0 + s2 * (b * lookahead[1]) + per_request + sv) * factors.get(b + 1, 1.0), 1e-9)
    if one > best:
        best, threshold, depth = one, top, 1
    values, kept = curves.values, [0] * b  # per request: its drafts in the set weighed
    gained, n, alive = 0.0, 0, range(b)  # alive: requests whose draft at the next depth may reach the bar
    for d in range(1, curves.kmax + 1):
        bar = sv * best
        reaching, mass = curves.reaching_at(d, alive, bar)
        if not reaching:
            break
        for r in reaching:
            kept[r] = d
        gained, n = gained + mass, n + len(reaching)
        base = s0 + s2 * (b * lookahead[d]) + per_request
        while True:  # the drafts at depth <= d reaching `bar`, as long as their speed beats the best
            seconds = (base + sv * n) * factors.get(b + n, 1.0)
            speed = (b + gained) / (seconds if seconds > 1e-9 else 1e-9)  # the fit may reach 0
            if not (n and speed > best):  # (no draft at all is no candidate: a plain step costs less)
                break
            best, threshold, depth = speed, bar, d
            bar = sv * best
            for r, k in enumerate(kept):
                while k and values[r][k - 1] < bar:
                    k, gained, n = k - 1, gained - values[r][k - 1], n - 1
                kept[r] = k
        alive = [r for r in reaching if kept[r] == d]
    return threshold, depth


def _best_depth_alone(curves: Curves, costs: tuple[float, float, float, float, float], lookahead_rows: list[int],
                      speculate: bool, factors: dict[int, float]) -> tuple[float, int]:
    """`best_drafts` for a batch of one request, whose candidate sets are its first d drafts: depth by depth in one
    loop, up to the first draft below sv x the best speed so far (the same stopping rule) past the depth after the
    deepest whose factor is measured (a measured step may cost less than a shallower one, and the depth after it is
    the first priced on the fit alone), without the batch's bookkeeping. The threshold is the deepest kept draft's
    probability."""
    s0, sb, sv, s2, plain = costs
    lookahead, values, kmax = lookahead_rows, curves.values[0], curves.kmax
    measured = max(factors, default=1) - 1  # the deepest draft whose step's factor is measured
    best, threshold, depth = (-np.inf, np.inf, 0) if speculate else (1.0 / max(plain + sb, 1e-9), np.inf, 0)
    tokens, base = 1.0, s0 + sb
    for d in range(1, kmax + 1):
        if d > len(values):
            curves.extend(0, min(2 * d, kmax))
        p = values[d - 1]
        if p < sv * best and d > measured + 1:  # (a first draft changes the step's fixed cost: always weighed)
            break
        tokens += p
        seconds = (base + s2 * lookahead[d] + sv * d) * factors.get(1 + d, 1.0)
        speed = tokens / (seconds if seconds > 1e-9 else 1e-9)
        if speed > best:
            best, threshold, depth = speed, p, d
    return threshold, depth


def drafts_per_request(curves: Curves, threshold: float, depth: int, short: int, min_k: int,
                       caps: list[int]) -> tuple[list[int], float]:
    """Each request's K: its drafts at most `depth` deep whose acceptance probability reaches `threshold` (at least
    `min_k`; 0 becomes `short`, a trial's short draft), within `caps`; and the tokens per request they are expected
    to emit (one, and each request's probabilities over its kept drafts)."""
    ks, expected = [], 0.0
    for r, cap in enumerate(caps):
        k = min(max(curves.reaching(r, threshold, depth), min_k) or short, cap)
        if k:
            expected += sum(curves.prefix(r, k))
        ks.append(k)
    return ks, 1.0 + expected / len(ks)


class Weighing:
    """`best_drafts`, kept for `REWEIGH_EVERY` steps at a batch of `REWEIGH_FROM` requests or more of the size the
    latest weighing saw, where the caller allows it: each request's K still follows its own curve, and a threshold
    set by many requests moves little in a few steps, or when one of them ends and another joins; at smaller
    batches the weighing is cheap and a stale threshold costs more."""

    __slots__ = ("size", "step", "threshold", "depth")

    def __init__(self) -> None:
        self.size, self.step, self.threshold, self.depth = 0, 0, np.inf, 0  # the latest weighing's batch, step, result

    def weigh(self, curves: Curves, cost: CostModel, lookahead_rows: list[int], step: int, speculate: bool,
              may_keep: bool) -> tuple[float, int]:
        """(threshold, depth) for the batch of `curves` at `step`: the latest weighing's when `may_keep` and it
        still stands, else `best_drafts` afresh."""
        size = len(curves.values)
        if (size >= REWEIGH_FROM and may_keep and self.threshold < np.inf
                and step - self.step < REWEIGH_EVERY and size == self.size):
            return self.threshold, self.depth
        threshold, depth = best_drafts(curves, cost.terms(), lookahead_rows, speculate, cost.token_factors())
        self.size, self.step, self.threshold, self.depth = size, step, threshold, depth
        return threshold, depth
