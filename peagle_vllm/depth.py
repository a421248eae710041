"""Adaptive speculation depth: each step, each request's K (0..K_max) from its measured acceptance and
the measured cost of verifying tokens, maximising expected emitted tokens per unit of step time.

Model. Request r accepts its i-th draft with probability P_r(i) = prod_{j<=i} a_r(j) (a: per-position
conditional acceptance, estimated online with decay, shrunk towards the all-request prior). A step
costs c0 + c1 * T for T scheduled tokens. Emitted tokens are B + sum of P over the drafts kept. Since
P_r(i) falls with i, the best set of drafts is the top-n values of P overall for some n: sort once,
pick the n maximising (B + prefix sum) / (c0 + c1 (B + n)). A request whose K falls to 0 falls back to
plain decoding and is probed again with a short draft every `probe_every` steps.

KV lookahead follows each request's own K: `reservation` says how many drafts a request may get at
its next choice (at most twice its last K, so K can grow step by step), the scheduler reserves
draft-head slots for that many only, and `choose` never exceeds what was reserved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PRIOR_DECAY = 0.97  # weight of the past in the all-request prior, per observation


@dataclass
class DepthOptions:
    max_k: int
    min_k: int = 0
    probe_every: int = 16
    probe_k: int = 2
    decay: float = 0.9  # weight of the past per observation (per request)
    prior_weight: float = 2.0  # pseudo-observations of the global prior in each request's estimate

    def __post_init__(self) -> None:
        if not 0 <= self.min_k <= self.max_k:
            raise ValueError(f"min_k must lie in 0..max_k ({self.max_k}), got {self.min_k}")


@dataclass
class _Stats:
    tries: np.ndarray
    hits: np.ndarray
    idle_steps: int = 0
    last_k: int | None = None


@dataclass
class CostModel:
    """Step seconds ~ c0 + c1 * tokens, fitted online by decayed least squares."""

    c0: float = 1.0
    c1: float = 0.02
    decay: float = 0.98
    _s: np.ndarray = field(default_factory=lambda: np.zeros(5))  # n, x, y, xx, xy

    def observe(self, tokens: int, seconds: float) -> None:
        self._s = self._s * self.decay + np.array([1.0, tokens, seconds, tokens * tokens, tokens * seconds])
        n, x, y, xx, xy = self._s
        var = n * xx - x * x
        if n > 3 and var > 1e-9 * max(1.0, n * xx):
            c1 = (n * xy - x * y) / var
            c0 = (y - c1 * x) / n
            if c1 > 0 and c0 > 0:
                self.c0, self.c1 = c0, c1


class DepthController:
    """Per-request K from online acceptance statistics and a fitted step-cost model."""

    def __init__(self, options: DepthOptions) -> None:
        self.opt = options
        k = options.max_k
        self.requests: dict[str, _Stats] = {}
        self.prior_tries = np.full(k, 1.0)
        self.prior_hits = np.full(k, 0.5)
        self.cost = CostModel()
        self.typical_k = k  # largest K of the latest choice: what a new request may start from

    def observe(self, req_id: str, num_draft: int, num_accepted: int) -> None:
        """One verification result: drafts 1..num_accepted accepted, draft num_accepted+1 rejected."""
        if num_draft <= 0:
            return
        k = self.opt.max_k
        s = self._stats(req_id)
        seen = min(num_accepted + 1, num_draft)
        tries = np.zeros(k)
        tries[:seen] = 1.0
        hits = np.zeros(k)
        hits[:num_accepted] = 1.0
        s.tries = s.tries * self.opt.decay + tries
        s.hits = s.hits * self.opt.decay + hits
        self.prior_tries = self.prior_tries * PRIOR_DECAY + tries
        self.prior_hits = self.prior_hits * PRIOR_DECAY + hits

    def _stats(self, req_id: str) -> _Stats:
        s = self.requests.get(req_id)
        if s is None:
            s = self.requests[req_id] = _Stats(np.zeros(self.opt.max_k), np.zeros(self.opt.max_k))
        return s

    def observe_step(self, tokens: int, seconds: float) -> None:
        self.cost.observe(tokens, seconds)

    def forget(self, req_id: str) -> None:
        self.requests.pop(req_id, None)

    def _accept_curves(self, req_ids: list[str]) -> np.ndarray:
        """P_r(i) [B, K]: probability that request r's first i drafts are all accepted."""
        prior = self.prior_hits / np.maximum(self.prior_tries, 1e-9)
        w = self.opt.prior_weight
        rows = []
        for rid in req_ids:
            s = self.requests.get(rid)
            rows.append(prior if s is None else (s.hits + w * prior) / (s.tries + w))
        return np.cumprod(np.clip(np.array(rows), 0.0, 1.0), axis=1)

    def reservation(self, req_id: str) -> int:
        """Most drafts this request may be given at its next choice (and lookahead to reserve for)."""
        s = self.requests.get(req_id)
        last = self.typical_k if s is None or s.last_k is None else s.last_k
        if last == 0 and (s is None or s.idle_steps + 1 < self.opt.probe_every):
            return self.opt.min_k  # in fallback and no probe due: plain decoding next step
        return int(min(self.opt.max_k, max(2 * last, self.opt.probe_k, self.opt.min_k)))

    def choose(self, req_ids: list[str], caps: list[int] | None = None) -> list[int]:
        """K for each request of this step's batch; `caps` (e.g. the drafts whose KV slots were
        reserved) bound each request's K from above."""
        if not req_ids:
            return []
        b, kmax = len(req_ids), self.opt.max_k
        curves = self._accept_curves(req_ids)
        flat = np.sort(curves.ravel())[::-1]
        gain = b + np.concatenate([[0.0], np.cumsum(flat)])
        cost = self.cost.c0 + self.cost.c1 * (b + np.arange(len(flat) + 1))
        n = int(np.argmax(gain / cost))
        threshold = flat[n - 1] if n > 0 else np.inf
        ks = np.clip((curves >= threshold).sum(axis=1), self.opt.min_k, kmax)
        out = []
        for rid, k in zip(req_ids, ks.tolist()):
            s = self._stats(rid)
            if k == 0:
                s.idle_steps += 1
                if s.idle_steps >= self.opt.probe_every:  # fallback requests are probed again
                    s.idle_steps, k = 0, min(self.opt.probe_k, kmax)
            else:
                s.idle_steps = 0
            k = int(k) if caps is None else min(int(k), caps[len(out)])
            s.last_k = k
            out.append(k)
        self.typical_k = max(out)
        return out
