"""Adaptive speculation depth: each step, each request's K (0..K_max) from its measured acceptance and
the measured cost of a step, maximising expected emitted tokens per unit of step time.

Model. Request r accepts its i-th draft with probability P_r(i) = prod_{j<=i} a_r(j) (a: per-position
conditional acceptance, estimated online with decay, shrunk towards the all-request prior). A step
that verifies T tokens and drafts D rows (the head runs over B requests x the step's draft depth)
costs c0 + c1 T + c2 D + c3 [D > 0]; c3 is what running the draft path at all costs (on a small
target it can exceed a whole plain step). Emitted tokens are B + the sum of P over the drafts kept.
Since P_r(i) falls with i, the best set of drafts is the top-n values of P overall for some n: sort
once, pick the n maximising (B + prefix sum) / cost(n), where n = 0 is a plain step (nothing
verified, nothing drafted). Requests whose K is 0 fall back to plain decoding; when every request is
there, no draft runs at all. Every `probe_every` steps requests at K=0 are probed with a short draft,
and every `explore_every` steps a plain step is forced, so that both sides of the cost model stay
measured.

KV lookahead follows each request's own K: `reservation` says how many drafts a request may get at
its next choice (at most twice its last K, so K can grow step by step; 0 in fallback until a probe),
the scheduler reserves draft-head slots for that many only, the head drafts only as deep as the
deepest reservation, and `choose` never exceeds what was reserved.
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
    explore_every: int = 64  # a plain step is forced this often while speculating
    decay: float = 0.9  # weight of the past per observation (per request)
    prior_weight: float = 2.0  # pseudo-observations of the global prior in each request's estimate

    def __post_init__(self) -> None:
        if not 0 <= self.min_k <= self.max_k:
            raise ValueError(f"min_k must lie in 0..max_k ({self.max_k}), got {self.min_k}")


@dataclass
class _Stats:
    tries: np.ndarray
    hits: np.ndarray
    last_k: int | None = None


@dataclass
class CostModel:
    """Step seconds ~ c0 + c1 T + c2 D + c3 [D > 0] (T verified tokens, D draft rows), fitted online by
    decayed least squares with a small ridge towards the current fit (steady when a feature barely
    varies). Until a few steps are seen, and for directions never excited, the defaults hold."""

    c: np.ndarray = field(default_factory=lambda: np.array([1.0, 0.02, 0.0, 0.0]))
    decay: float = 0.98
    ridge: float = 1e-6
    _xx: np.ndarray = field(default_factory=lambda: np.zeros((4, 4)))
    _xy: np.ndarray = field(default_factory=lambda: np.zeros(4))
    seen: int = 0

    @property
    def c0(self) -> float:
        return float(self.c[0])

    @property
    def c1(self) -> float:
        return float(self.c[1])

    def observe(self, tokens: int, draft_rows: int, seconds: float) -> None:
        x = np.array([1.0, tokens, draft_rows, 1.0 if draft_rows else 0.0])
        self._xx = self._xx * self.decay + np.outer(x, x)
        self._xy = self._xy * self.decay + x * seconds
        self.seen += 1
        if self.seen < 4:
            return
        reg = self.ridge * np.diag(np.maximum(np.diag(self._xx), 1e-9))
        fit = np.linalg.solve(self._xx + reg, self._xy + reg @ self.c)
        self.c = np.maximum(fit, 0.0)
        if self.c[0] <= 0:
            self.c[0] = max(seconds, 1e-9)

    def seconds(self, tokens: np.ndarray, draft_rows: np.ndarray) -> np.ndarray:
        """Predicted step time for each (tokens, draft rows) pair."""
        return self.c[0] + self.c[1] * tokens + self.c[2] * draft_rows + self.c[3] * (draft_rows > 0)


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
        self.steps = 0  # choices made: the clock of probes and exploration
        self.speculating = True  # whether the latest choice found drafting worth its cost
        self.probe_interval = options.probe_every  # doubles after each probe that confirms the fallback
        self.next_probe = options.probe_every
        self.plain_next = False  # an exploration step was chosen: reserve nothing, so no draft runs
        self.k_counts = np.zeros(k + 1, dtype=np.int64)  # chosen K per request per step, since the last summary

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

    def observe_step(self, tokens: int, draft_rows: int, seconds: float) -> None:
        """One engine step: target tokens it computed, draft-head rows it ran (0: no draft), its time."""
        self.cost.observe(tokens, draft_rows, seconds)

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
        if self.plain_next or (last == 0 and not self.speculating and self.steps + 1 < self.next_probe):
            return self.opt.min_k  # exploring, or in fallback with no probe due: plain decoding next step
        return int(min(self.opt.max_k, max(2 * last, self.opt.probe_k, self.opt.min_k)))

    def _best_draft_count(self, curves: np.ndarray) -> tuple[int, np.ndarray]:
        """n maximising expected tokens per predicted second over the top-n acceptance probabilities
        (n = 0: a plain step), and those probabilities sorted."""
        b, kmax = curves.shape
        order = np.argsort(curves.ravel(), kind="stable")[::-1]
        flat = curves.ravel()[order]
        depth = np.maximum.accumulate(order % kmax + 1)  # draft depth the top-n drafts need
        gain = b + np.concatenate([[0.0], np.cumsum(flat)])
        tokens = b + np.arange(len(flat) + 1)
        rows = np.concatenate([[0], b * depth])
        return int(np.argmax(gain / self.cost.seconds(tokens, rows))), flat

    def choose(self, req_ids: list[str], caps: list[int] | None = None) -> list[int]:
        """K for each request of this step's batch; `caps` (e.g. the drafts whose KV slots were
        reserved) bound each request's K from above."""
        if not req_ids:
            return []
        self.steps += 1
        kmax = self.opt.max_k
        curves = self._accept_curves(req_ids)
        n, flat = self._best_draft_count(curves)
        if self.speculating and n == 0:  # entering fallback: the first probe comes one interval later
            self.next_probe = self.steps + self.probe_interval
        self.speculating = n > 0
        self.plain_next = False
        if self.speculating:
            self.probe_interval = self.opt.probe_every
            if self.steps % self.opt.explore_every == self.opt.probe_every // 2:
                n, self.plain_next = 0, True  # a forced plain step keeps the cost of plain decoding measured
        probe = not self.speculating and self.steps >= self.next_probe
        if probe:
            self.next_probe = self.steps + self.probe_interval
            self.probe_interval = min(2 * self.probe_interval, 16 * self.opt.probe_every)
        threshold = flat[n - 1] if n > 0 else np.inf
        ks = np.clip((curves >= threshold).sum(axis=1), self.opt.min_k, kmax)
        out = []
        for i, (rid, k) in enumerate(zip(req_ids, ks.tolist())):
            if k == 0 and probe:  # requests in fallback are probed again with a short draft
                k = min(self.opt.probe_k, kmax)
            k = int(k) if caps is None else min(int(k), caps[i])
            self._stats(rid).last_k = k
            out.append(k)
        self.typical_k = max(out)
        self.k_counts += np.bincount(out, minlength=kmax + 1)
        return out

    def summary(self) -> str:
        """One log line on the choices since the last call (then reset): K distribution, fallbacks,
        and the fitted step cost, whose draft terms are the measured cost of drafting."""
        total = int(self.k_counts.sum())
        if not total:
            return ""
        ks = np.arange(len(self.k_counts))
        c = self.cost.c
        line = (f"chosen K mean {float(ks @ self.k_counts) / total:.2f} (0: {self.k_counts[0] / total:.0%}, "
                f"1-4: {self.k_counts[1:5].sum() / total:.0%}, 5-16: {self.k_counts[5:17].sum() / total:.0%}, "
                f">16: {self.k_counts[17:].sum() / total:.0%}), {'speculating' if self.speculating else 'fallback'}; "
                f"step cost {1e3 * c[0]:.2f} ms + {1e3 * c[1]:.3f} ms/token, draft {1e3 * c[3]:.2f} ms + "
                f"{1e3 * c[2]:.4f} ms/row")
        self.k_counts[:] = 0
        return line
