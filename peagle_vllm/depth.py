"""Adaptive speculation depth: each step, each request's K (0..K_max) from its measured acceptance and
the measured cost of a step, maximising expected emitted tokens per unit of step time.

Model. Request r accepts its i-th draft with probability P_r(i) = prod_{j<=i} a_r(j) (a: per-position
conditional acceptance, estimated online with decay, shrunk towards the all-request prior). A step
that verifies T tokens and drafts D rows (the head runs over B requests x the step's draft depth)
costs s0 + s1 T + s2 D; a plain step (no draft) costs p0 + s1 T, and s0 - p0 is what running the
draft path at all costs (on a small target it can exceed a whole plain step). Emitted tokens are
B + the sum of P over the drafts kept. Since P_r(i) falls with i, the best set of drafts is the
top-n values of P overall for some n: sort once, pick the n maximising (B + prefix sum) / cost(n),
where n = 0 is a plain step (nothing verified, nothing drafted). The model can be biased (costs that
are not linear, overheads it cannot see), so the measured speed (tokens per request-second) of
recent speculative and plain decode steps has the last word: while speculation measures slower
(steps that only ran the draft count as speculative: they paid for it), every request is at K=0.
Requests whose K is 0 fall back to plain decoding; when every request is there, no draft runs at
all. Probes: after `probe_every` steps in fallback, requests get a short draft again, and for
`probe_steps` steps the model alone chooses K (growing as the reservations allow), so that the
measured speed of speculation is that of the K it would use, not of a token probe; the interval
doubles, up to 16x, while fallback keeps winning, and starts again from `probe_every` only after
speculation has held for that many steps. Every `explore_every` steps of speculation a plain step
is forced, so that both sides of the cost model stay measured, and so is every step at a batch size
whose plain speed is not measured yet (speculation there waits for a plain step to compare with).

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
    probe_steps: int = 4  # steps of a probe in which measured speeds do not overrule the model
    explore_every: int = 64  # a plain step is forced this often while speculating
    decay: float = 0.9  # weight of the past per observation (per request)
    prior_weight: float = 2.0  # pseudo-observations of the global prior in each request's estimate

    def __post_init__(self) -> None:
        if not 0 <= self.min_k <= self.max_k:
            raise ValueError(f"min_k must lie in 0..max_k ({self.max_k}), got {self.min_k}")


@dataclass(frozen=True)
class Step:
    """One engine step as the scheduler saw it."""

    tokens: int  # target tokens computed (scheduled)
    draft_rows: int  # draft-head rows run (requests x draft depth; 0: no draft ran)
    seconds: float
    requests: int = 1  # requests in the batch
    emitted: int = 0  # tokens the step produced (accepted drafts + one per request)
    verified: int = 0  # drafts it verified

    @property
    def decode_only(self) -> bool:
        """Every request computed one new token plus its drafts: no prompt (prefill) in the step, whose
        cost would say nothing about plain vs speculative decoding."""
        return self.tokens == self.requests + self.verified


@dataclass
class _Speed:
    """Tokens per request-second of one kind of step, from decayed sums (recent steps weigh more)."""

    decay: float = 0.8
    tokens: float = 0.0
    request_seconds: float = 0.0

    def add(self, step: Step) -> None:
        self.tokens = self.tokens * self.decay + step.emitted
        self.request_seconds = self.request_seconds * self.decay + step.requests * step.seconds

    @property
    def value(self) -> float | None:
        return self.tokens / self.request_seconds if self.request_seconds > 0 else None


@dataclass
class _Stats:
    tries: np.ndarray
    hits: np.ndarray
    last_k: int | None = None


@dataclass
class CostModel:
    """Step seconds, fitted online, two ways. A step that runs the draft: s0 + s1 T + s2 D (decayed
    least squares with a small ridge towards the current fit, steady when a feature barely varies).
    A plain step (no draft): p0 + s1 T, sharing the target's per-token cost; p0 is a decayed mean over
    plain steps only, so that it survives long stretches of speculation between two of them. Until a
    plain step is seen, p0 is taken as s0 (the draft path assumed free: speculation is tried first)."""

    s: np.ndarray = field(default_factory=lambda: np.array([1e-2, 1e-4, 1e-5]))
    p0: float | None = None
    decay: float = 0.98
    plain_decay: float = 0.8
    ridge: float = 1e-6
    _xx: np.ndarray = field(default_factory=lambda: np.zeros((3, 3)))
    _xy: np.ndarray = field(default_factory=lambda: np.zeros(3))
    _plain: np.ndarray = field(default_factory=lambda: np.zeros(2))  # decayed count, decayed sum of p0 samples
    seen: int = 0

    def observe(self, tokens: int, draft_rows: int, seconds: float) -> None:
        if not draft_rows:
            self._plain = self._plain * self.plain_decay + np.array([1.0, seconds - self.s[1] * tokens])
            self.p0 = max(float(self._plain[1] / self._plain[0]), 0.0)
            return
        x = np.array([1.0, tokens, draft_rows])
        self._xx = self._xx * self.decay + np.outer(x, x)
        self._xy = self._xy * self.decay + x * seconds
        self.seen += 1
        if self.seen >= 3:
            reg = self.ridge * np.diag(np.maximum(np.diag(self._xx), 1e-9))
            self.s = np.maximum(np.linalg.solve(self._xx + reg, self._xy + reg @ self.s), 0.0)

    def seconds(self, tokens: np.ndarray, draft_rows: np.ndarray) -> np.ndarray:
        """Predicted step time for each (tokens, draft rows) pair; 0 draft rows is a plain step."""
        s0, s1, s2 = self.s
        plain = s0 if self.p0 is None else self.p0
        return np.where(draft_rows > 0, s0 + s2 * draft_rows, plain) + s1 * tokens


def _bucket(batch: int) -> int:
    """Batch sizes within a factor of two share their speed figures."""
    return max(batch, 1).bit_length()


class DepthController:
    """Per-request K from online acceptance statistics and a fitted step-cost model."""

    def __init__(self, options: DepthOptions) -> None:
        self.opt = options
        k = options.max_k
        self.requests: dict[str, _Stats] = {}
        self.prior_tries = np.zeros(k)
        self.prior_hits = np.zeros(k)
        self.cost = CostModel()
        self.typical_k = k  # largest K of the latest choice: what a new request may start from
        self.steps = 0  # choices made: the clock of probes and exploration
        self.speculating = True  # whether the latest choice found drafting worth its cost
        self.probe_interval = options.probe_every  # doubles after each probe that confirms the fallback
        self.next_probe = options.probe_every
        self.probe_until = 0  # the current probe's last step
        self.plain_next = False  # an exploration step was chosen: reserve nothing, so no draft runs
        self.spec_since = 0  # step at which the current stretch of speculation began
        # per batch-size bucket: recent plain steps (no draft ran, nothing verified) and steps that ran
        # the draft or verified drafts (all speculation costs)
        self.speeds: dict[int, tuple[_Speed, _Speed]] = {}
        self.summarized = 0  # `steps` at the latest summary

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

    def observe_step(self, step: Step) -> None:
        """One engine step: it fits the cost model, and the measured speed of plain steps and of
        speculative ones (a step that ran the draft but verified nothing, like the first half of a
        probe, counts there: it paid for the draft) decides between the two. Steps with a prompt in
        them are left out of the speeds: a prefill in a plain stretch would make plain look slow."""
        self.cost.observe(step.tokens, step.draft_rows, step.seconds)
        if step.seconds <= 0 or not step.emitted or not step.decode_only:
            return
        plain, spec = self.speeds.setdefault(_bucket(step.requests), (_Speed(), _Speed()))
        (spec if step.draft_rows or step.verified else plain).add(step)

    def speculation_measured_slower(self, batch: int) -> bool:
        """Recent speculative steps emitted fewer tokens per request-second than plain ones, at about
        this batch size (per-request speed falls with the batch: only like is compared with like; the
        nearest measured bucket stands in until this one is)."""
        measured = [b for b, (p, s) in self.speeds.items() if p.value is not None and s.value is not None]
        if not measured:
            return False
        plain, spec = self.speeds[min(measured, key=lambda b: abs(b - _bucket(batch)))]
        return spec.value <= plain.value

    def _plain_unmeasured(self, batch: int) -> bool:
        """No plain decode step has been timed at about this batch size yet (a new load level)."""
        speeds = self.speeds.get(_bucket(batch))
        return speeds is None or speeds[0].value is None

    def forget(self, req_id: str) -> None:
        self.requests.pop(req_id, None)

    def _accept_curves(self, req_ids: list[str]) -> np.ndarray:
        """P_r(i) [B, K]: probability that request r's first i drafts are all accepted (a request not
        seen yet has no hits or tries of its own: the prior)."""
        prior = self._prior_rates()
        w = self.opt.prior_weight
        none = np.zeros(self.opt.max_k)
        stats = [self.requests.get(rid) for rid in req_ids]
        hits = np.stack([none if s is None else s.hits for s in stats])
        tries = np.stack([none if s is None else s.tries for s in stats])
        return np.cumprod(np.clip((hits + w * prior) / (tries + w), 0.0, 1.0), axis=1)

    def _prior_rates(self) -> np.ndarray:
        """All-request conditional acceptance per position, each shrunk towards the position before
        it: a position rarely tried (K has not reached it lately) is assumed to accept like the last
        one measured, not like a stale start value, so K can still grow into it."""
        rates = np.empty(self.opt.max_k)
        before = 0.5
        for j in range(self.opt.max_k):
            before = rates[j] = (self.prior_hits[j] + self.opt.prior_weight * before) / (self.prior_tries[j] +
                                                                                          self.opt.prior_weight)
        return rates

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
        return int(np.argmax(gain / np.maximum(self.cost.seconds(tokens, rows), 1e-9))), flat  # fit may reach 0

    def choose(self, req_ids: list[str], caps: list[int] | None = None) -> list[int]:
        """K for each request of this step's batch; `caps` (e.g. the drafts whose KV slots were
        reserved) bound each request's K from above."""
        if not req_ids:
            return []
        self.steps += 1
        kmax = self.opt.max_k
        slower = self.steps > self.probe_until and self.speculation_measured_slower(len(req_ids))
        if slower and not self.speculating and self.steps < self.next_probe:
            return self._stay_in_fallback(req_ids)
        curves = self._accept_curves(req_ids)
        n, flat = self._best_draft_count(curves)
        if slower:
            n = 0  # measured: speculation is slower than plain decoding, whatever the model predicts
        if self.speculating and n == 0:  # entering fallback: the first probe comes one interval later
            self.next_probe = self.steps + self.probe_interval
        if n > 0 and not self.speculating:
            self.spec_since = self.steps
        self.speculating = n > 0
        self.plain_next = False
        if self.speculating:
            if self.steps - self.spec_since >= self.opt.probe_every:  # speculation held up: probe soon again
                self.probe_interval = self.opt.probe_every  # once it falls back (a short stretch keeps the backoff)
            unmeasured = self._plain_unmeasured(len(req_ids))
            if unmeasured or self.steps % self.opt.explore_every == self.opt.probe_every // 2:
                n, self.plain_next = 0, True  # a forced plain step keeps the cost of plain decoding measured
        probe = not self.speculating and self.steps >= self.next_probe
        if probe:
            self.next_probe = self.steps + self.probe_interval
            self.probe_interval = min(2 * self.probe_interval, 16 * self.opt.probe_every)
            self.probe_until = self.steps + self.opt.probe_steps
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
        return out

    def _stay_in_fallback(self, req_ids: list[str]) -> list[int]:
        """`choose` for a batch in fallback with no probe due: K=0 for all, nothing to weigh."""
        self.plain_next = False
        for rid in req_ids:
            self._stats(rid).last_k = 0
        self.typical_k = 0
        return [0] * len(req_ids)

    def summary(self) -> str:
        """One log line on the controller's state when it chose since the last call: speculating or in
        fallback, and the fitted step costs, whose draft terms are the measured cost of drafting (the
        chosen K themselves are counted by the engine figures, `peagle:chosen_k`)."""
        if self.steps == self.summarized:
            return ""
        self.summarized = self.steps
        (s0, s1, s2), p0 = self.cost.s, self.cost.p0
        plain = "not measured yet" if p0 is None else f"{1e3 * p0:.2f} ms"
        return (f"{'speculating' if self.speculating else 'fallback'}, probe interval {self.probe_interval} steps; "
                f"fitted step cost: plain {plain}, with the draft {1e3 * s0:.2f} ms + {1e3 * s2:.4f} ms/draft row, "
                f"+ {1e3 * s1:.3f} ms/token")
