"""Acceptance estimates: how likely each request's i-th draft is accepted, and the curves built from them.

Request r accepts its i-th draft with probability P_r(i) = prod_{j<=i} a_r(j), a_r(j) being the conditional
acceptance at position j: estimated online per request with decay, shrunk towards the all-request prior (which
in turn shrinks each position towards the one before it, so that K can grow into positions rarely tried).
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_DECAY = 0.97  # weight of the past in the all-request prior, per observation
RESCALE = 1e64  # lazily decayed sums (`Counts`, `CostModel`) are brought back to scale 1 beyond this


@dataclass(slots=True)
class Counts:
    """Decayed tries and hits per draft position, decayed lazily: kept as the true counts x `scale`, which grows
    by 1/decay per observation, so that an observation touches only the positions it reached (decaying every
    position of every request each step would dominate the update's time)."""

    tries: list[float]  # [K_max], true tries x scale
    hits: list[float]  # [K_max], true hits x scale
    scale: float = 1.0

    def add(self, seen: int, accepted: int, decay: float) -> None:
        """One verification: positions 1..seen tried, 1..accepted accepted; the past weighs `decay` less."""
        self.scale = scale = self.scale / decay
        tries, hits = self.tries, self.hits
        for i in range(seen):
            tries[i] += scale
        for i in range(accepted):
            hits[i] += scale
        if scale > RESCALE:
            self.tries, self.hits, self.scale = [t / scale for t in tries], [h / scale for h in hits], 1.0


@dataclass(slots=True)
class RequestStats:
    """One request's own acceptance counts, and the K it was given at its latest choice (None before one)."""

    counts: Counts
    last_k: int | None = None


class Curves:
    """A batch's acceptance curves, P_r(i) = the probability that request r's first i drafts are all accepted,
    computed only as far as asked for: the first of each, then (`reaching_at`) depth by depth for the requests
    whose drafts may still count, then further only for ties and short drafts. Plain loops on floats: most of the
    B x K_max drafts never count, and numpy's per-call overhead would outweigh the arithmetic."""

    __slots__ = ("rows", "prior", "kmax", "values", "_counts", "_weight")

    def __init__(self, rows: list[tuple[list[float], list[float], float]], prior: Counts, prior_weight: float,
                 kmax: int) -> None:
        self.rows = rows  # per request: its decayed hits, tries (`Counts`), and the prior's weight on their scale
        self.kmax, self._counts, self._weight = kmax, prior, prior_weight * prior.scale
        self.prior: list[float] = []  # the prior's rates, as far as computed (`_prior_to`)
        self._prior_to(1)
        p0 = self.prior[0]
        self.values = [[min((hits[0] + w * p0) / (tries[0] + w), 1.0)] for hits, tries, w in rows]  # [B][<=K_max]

    def _prior_to(self, upto: int) -> None:
        """The all-request conditional acceptance at positions 1..upto, each shrunk towards the position before
        it: a position rarely tried (K has not reached it lately) is assumed to accept like the last one
        measured, not like a stale start value, so K can still grow into it."""
        rates, hits, tries, w = self.prior, self._counts.hits, self._counts.tries, self._weight
        before = rates[-1] if rates else 0.5
        for i in range(len(rates), min(upto, self.kmax)):
            before = (hits[i] + w * before) / (tries[i] + w)
            rates.append(before)

    def reaching(self, r: int, threshold: float, upto: int) -> int:
        """How many of request r's first `upto` drafts have a probability of at least `threshold` (a prefix: P
        falls)."""
        values, k, upto = self.values[r], 0, min(upto, self.kmax)
        while True:
            if k == upto:
                return k
            if k == len(values):  # past what the weighing computed (a kept weighing's, ties at the threshold)
                self.extend(r, upto)
            if values[k] < threshold:
                return k
            k += 1

    def reaching_at(self, d: int, rows: list[int] | range, bar: float) -> tuple[list[int], float]:
        """Those of these requests (whose curves reach depth d - 1) whose P_r(d) reaches `bar`, and the sum of
        their P_r(d); computed where missing, inline (a call per value would cost more than the arithmetic)."""
        if d > len(self.prior):
            self._prior_to(2 * d)
        prior_rate, i, reaching, total = self.prior[d - 1], d - 1, [], 0.0
        for r in rows:
            values = self.values[r]
            if len(values) == i:
                hits, tries, w = self.rows[r]
                rate = (hits[i] + w * prior_rate) / (tries[i] + w)
                p = values[-1] * (rate if rate < 1.0 else 1.0)
                values.append(p)
            else:
                p = values[i]
            if p >= bar:
                reaching.append(r)
                total += p
        return reaching, total

    def prefix(self, r: int, upto: int) -> list[float]:
        """P_r(1..upto)."""
        self.extend(r, upto)
        return self.values[r][:upto]

    def extend(self, r: int, upto: int) -> None:
        """Request r's curve computed to depth `upto`."""
        hits, tries, w = self.rows[r]
        values, prior = self.values[r], self.prior
        p, i = values[-1], len(values)
        while i < upto:
            if i == len(prior):
                self._prior_to(2 * i)
            rate = (hits[i] + w * prior[i]) / (tries[i] + w)
            p *= rate if rate < 1.0 else 1.0  # (not min(): a call costs twice this loop's arithmetic)
            values.append(p)
            i += 1


class Acceptance:
    """Every request's acceptance counts (decayed by `decay` per observation), and the all-request prior each
    request's rates are shrunk towards by `prior_weight` pseudo-observations, `batch_prior_weight` (default: the
    same) in a batch of more than one request: there the prior pools requests decoding together, and a request's
    few latest draws (at T=1 each draft is a coin toss) say less about its own rate than the pool does."""

    def __init__(self, max_k: int, decay: float, prior_weight: float, batch_prior_weight: float | None = None) -> None:
        self.max_k, self.decay, self.prior_weight = max_k, decay, prior_weight
        self.batch_prior_weight = prior_weight if batch_prior_weight is None else batch_prior_weight
        self.requests: dict[str, RequestStats] = {}
        self.prior = Counts([0.0] * max_k, [0.0] * max_k)  # all requests' acceptance, one observation after another
        self._zeros = [0.0] * max_k  # the counts of a request not seen yet

    def observe(self, req_ids: list[str], num_drafts: list[int], num_accepted: list[int]) -> None:
        """A step's verification results: request i's drafts 1..num_accepted[i] accepted, the next one rejected
        (requests that verified no draft are skipped). The prior takes them one after another."""
        decay, prior = self.decay, self.prior
        for req_id, drafts, accepted in zip(req_ids, num_drafts, num_accepted):
            if drafts > 0:
                seen = min(accepted + 1, drafts)
                self.stats(req_id).counts.add(seen, accepted, decay)
                prior.add(seen, accepted, PRIOR_DECAY)

    def stats(self, req_id: str) -> RequestStats:
        """The request's record, made on first use."""
        s = self.requests.get(req_id)
        if s is None:
            k = self.max_k
            s = self.requests[req_id] = RequestStats(Counts([0.0] * k, [0.0] * k))
        return s

    def forget(self, req_id: str) -> None:
        self.requests.pop(req_id, None)

    def curves(self, req_ids: list[str]) -> Curves:
        """The batch's acceptance curves (a request not seen yet: the prior alone)."""
        w = self.prior_weight if len(req_ids) == 1 else self.batch_prior_weight
        zeros, rows = self._zeros, []
        for rid in req_ids:
            s = self.requests.get(rid)
            rows.append((zeros, zeros, w) if s is None else (s.counts.hits, s.counts.tries, w * s.counts.scale))
        return Curves(rows, self.prior, w, self.max_k)
