"""The step-cost model: an engine step's seconds as a linear function of what it computes, fitted online."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from peagle_vllm.depth.acceptance import RESCALE

REFIT_EVERY = 8  # observations between two solves of the cost fit
FACTOR_WEIGHT = 3.0  # decayed drafting steps a token count's factor rests on before the optimiser uses it


@dataclass
class CostModel:
    """Step seconds, fitted online: s0 + s1 T + dv V + s2 D for a step that runs the draft (T tokens computed, V of
    them verified drafts, D draft rows), p0 + s1 T for a plain one (no draft).

    One decayed least-squares fit over both kinds, so that plain steps, whose batch sizes vary most, pin down the
    shared per-token cost s1 for speculation's choices too. A small ridge towards the current fit keeps a term
    steady while its feature barely varies (p0 through a long stretch of speculation), and pulls dv, what a
    verified draft costs beyond a request's token (negative down to -s1), towards 0: a draft is priced as a
    request's token until steps that vary the verified drafts apart from the batch size tell the two apart. No
    cost comes out negative: a term that would is held at 0 and the others are fitted again (clipping it
    afterwards would leave them fitted around a negative term). Until a plain step is seen, p0 is s0 (the draft
    path assumed free: speculation is tried first). Solved lazily, on floats, when a prediction is asked for and
    `REFIT_EVERY` observations are new: a decayed fit moves little in a few steps, and a step nobody asks about
    (in fallback) costs only the sums."""

    decay: float = 0.98
    ridge: float = 1e-6
    _s: list[float] = field(default_factory=lambda: [1e-2, 1e-4, 0.0, 1e-5])  # s0, s1, dv, s2 (seconds)
    _p0: float | None = None  # seconds
    # decayed sums of x x^T [5 x 5, row-major] and x y [5] over features x = (draft ran, plain, T, V, D), as
    # floats (numpy's per-call overhead would outweigh a step's arithmetic); decayed lazily as `Counts` is (kept x
    # `_scale`, which grows by 1/decay per step), so that a step adds only to the entries its features reach
    _xx: list[float] = field(default_factory=lambda: [0.0] * 25)
    _xy: list[float] = field(default_factory=lambda: [0.0] * 5)
    _scale: float = 1.0
    _seen: int = 0
    _new: int = 0  # observations since the fit was last solved
    # per token count of a drafting step: decayed sums of its steps, seconds, requests and draft rows (kept x
    # `_scale`, as the fit's sums are)
    _by_tokens: dict[int, list[float]] = field(default_factory=dict)

    def observe(self, requests: int, tokens: int, draft_rows: int, seconds: float) -> None:
        self._scale = scale = self._scale / self.decay
        x = [(0 if draft_rows else 1, scale), (2, tokens * scale)]  # each nonzero feature, times the scale
        if tokens > requests:
            x.append((3, (tokens - requests) * scale))
        if draft_rows:
            x.append((4, draft_rows * scale))
        xx, xy = self._xx, self._xy
        for i, xi in x:
            xy[i] += xi * seconds
            row = 5 * i
            for j, xj in x:
                xx[row + j] += xi * xj / scale  # x_i x_j, times the scale once
        if draft_rows:
            entry = self._by_tokens.setdefault(tokens, [0.0, 0.0, 0.0, 0.0])
            for i, value in enumerate((1.0, seconds, requests, draft_rows)):
                entry[i] += value * scale
        if scale > RESCALE:
            self._xx, self._xy, self._scale = [v / scale for v in xx], [v / scale for v in xy], 1.0
            self._by_tokens = {t: [v / scale for v in entry] for t, entry in self._by_tokens.items()
                               if entry[0] > 1e-3 * scale}  # (counts not seen for long are dropped)
        self._seen += 1
        self._new += 1

    def token_factors(self) -> dict[int, float]:
        """Tokens computed -> the recent drafting steps' mean seconds over what the fit prices them at, for the
        counts with `FACTOR_WEIGHT` decayed steps or more. The fit is linear in the tokens; this CPU's linear layers
        are not (2 rows cost more than 3 on SmolLM2's output layer), so the optimiser prices a step by its fit
        times this factor. The counts forget at the fit's rate: both speak of the same recent steps."""
        self._solve()
        s0, s1, dv, s2 = self._s
        out, least = {}, FACTOR_WEIGHT * self._scale
        for tokens, (steps, seconds, requests, rows) in self._by_tokens.items():
            fitted = (s0 + (s1 + dv) * tokens) * steps - dv * requests + s2 * rows
            if steps >= least and fitted > 0:
                out[tokens] = seconds / fitted
        return out

    def token_weights(self) -> dict[int, float]:
        """Tokens computed -> the decayed count of recent drafting steps that computed that many."""
        return {tokens: entry[0] / self._scale for tokens, entry in self._by_tokens.items()}

    def _solve(self) -> None:
        if self._seen < 3 or self._new < (REFIT_EVERY if self._seen > self._new else 1):
            return  # the starting values until 3 observations; then refitted every REFIT_EVERY
        self._new = 0
        s0, s1, _, s2 = self._s
        current = [s0, s0 if self._p0 is None else self._p0, s1, 0.0, s2]  # dv: 0 unless the data say otherwise
        xx, xy = [v / self._scale for v in self._xx], [v / self._scale for v in self._xy]
        reg = [self.ridge * max(xx[6 * i], 1e-9) for i in range(5)]  # the diagonal's entries
        a = [[xx[5 * i + j] + (reg[i] if i == j else 0.0) for j in range(5)] for i in range(5)]
        b = [y + r * c for y, r, c in zip(xy, reg, current)]
        free = list(range(5))
        while True:  # no cost is negative: a term that comes out negative is fixed at 0 and the rest refitted
            fit = [0.0] * 5
            for i, value in zip(free, _solve_linear([[a[i][j] for j in free] for i in free], [b[i] for i in free])):
                fit[i] = value
            if all(value >= 0 for i, value in enumerate(fit) if i != 3):  # dv, a difference, may be negative
                break
            free = [i for i in free if fit[i] > 0 or i == 3]
        s0, p0, s1, dv, s2 = fit
        self._s = [s0, s1, max(dv, -s1), s2]
        if xx[6] > 0:
            self._p0 = p0

    @property
    def s(self) -> np.ndarray:
        """[s0, sb, sv, s2] of the current fit (seconds): sb a request's token, sv a verified draft's (s1 + dv)."""
        return np.array(self.terms()[:4])

    @property
    def p0(self) -> float | None:
        """A plain step's fixed cost (seconds); None before any plain step was seen."""
        self._solve()
        return self._p0

    def terms(self) -> tuple[float, float, float, float, float]:
        """(s0, sb, sv, s2, plain) in seconds, plain being p0 (s0 before any plain step was seen): a step drafting D
        rows and verifying V drafts over B requests costs s0 + s2 D + sb B + sv V, a plain one plain + sb B."""
        self._solve()
        s0, s1, dv, s2 = self._s
        return s0, s1, s1 + dv, s2, (s0 if self._p0 is None else self._p0)

    def describe(self) -> str:
        """The fit in milliseconds, for the log."""
        (s0, sb, sv, s2), p0 = self.s, self.p0
        plain = "not measured yet" if p0 is None else f"{1e3 * p0:.2f} ms"
        return (f"plain {plain}, with the draft {1e3 * s0:.2f} ms + {1e3 * s2:.4f} ms/draft row, + {1e3 * sb:.3f} "
                f"ms/request + {1e3 * sv:.3f} ms/draft verified")


def _solve_linear(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b (a square and regular: here a positive definite normal matrix, 5 x 5 at most), by Gaussian
    elimination with partial pivoting, on floats."""
    n = len(b)
    rows = [row + [y] for row, y in zip(a, b)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(rows[r][c]))
        rows[c], rows[pivot] = rows[pivot], rows[c]
        top = rows[c]
        for row in rows[c + 1:]:
            f = row[c] / top[c]
            for k in range(c, n + 1):
                row[k] -= f * top[k]
    x = [0.0] * n
    for c in range(n - 1, -1, -1):
        x[c] = (rows[c][n] - sum(rows[c][k] * x[k] for k in range(c + 1, n))) / rows[c][c]
    return x
