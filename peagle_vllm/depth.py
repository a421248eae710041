"""Adaptive speculation depth: each step, each request's K (0..K_max) from its measured acceptance and
the measured cost of a step, maximising expected emitted tokens per unit of step time.

Model. Request r accepts its i-th draft with probability P_r(i) = prod_{j<=i} a_r(j) (a: per-position
conditional acceptance, estimated online with decay, shrunk towards the all-request prior). A step
over B requests that verifies V drafts and drafts D rows (the head runs over B requests x the step's
draft depth) costs s0 + sb B + sv V + s2 D; a plain step (no draft) costs p0 + sb B, and s0 - p0 is what
running the draft path at all costs (on a small target it can exceed a whole plain step). Emitted tokens are
B + the sum of P over the drafts kept. D follows the step's deepest draft (the head drafts every request
that deep), so for each draft depth d the best drafts are those at most d deep whose P reaches a threshold
(P_r(i) falls with i): the pair (d, threshold) maximising (B + their sum) / cost is chosen, or a plain step
(nothing verified, nothing drafted) when that is faster.

Measured speeds. The model can be biased (costs that are not linear, overheads it cannot see), so
the measured speed (tokens per request-second, per batch size within a factor of two) of recent
steady plain steps (no draft, nothing verified) and steady speculative ones (drafts verified, a
draft run) has the last word both ways: while speculation measures slower, every request is at
K=0 (no draft runs at all); while it measures faster, the model picks the best n > 0; within `TIE`
of each other the current regime stays, speculation at the end of a trial: at batch 1 a request that
falls back stays so for the rest of its life, often while its text grows predictable, and that loses
far more than speculating through a tie does (replays of the demo at concurrency 1: 0.96 of the best
fixed K, against 0.94 when a tie ended a trial in fallback). In fallback, only a trial (below) resumes
speculation: the speculative figure there
is as old as the last stretch of speculation, and a slow spell of the machine (its speed drifts by a
third within seconds here), which slows the plain steps timed now, would otherwise read as a gain;
when plain decoding measures slower than speculation last did, the trial comes early instead, but
not before half its interval at batch 1's budget has passed. Left out:
steps with a prompt in them, and the steps of a switch, paid once per stretch of speculation (the
step that drafts with nothing to verify, where the head also catches up on the tokens of the plain
steps before, the one after it, and the first plain step after a draft, which carries the last
choice's bookkeeping and the blocks it hands back). A speculative step is credited with the tokens
its drafts were expected to yield when chosen (the acceptance estimates, which rest on every
verification), not those it happened to yield: one step's accepted count varies by a third of its
mean, its time by a tenth, so a few timed steps then suffice. Plain speeds have a short memory
(their steps vary in time only, and an engine's first steps are slow), speculative ones a longer one.

Trials. Speculation is timed afresh by a trial: it runs at the K the model picks until
`probe_steps` steady steps are timed (the engine's start is one). In fallback a trial comes after
a number of steps set by what one costs at the measured speeds, switches included: about
`PROBE_BUDGET` of the time (2% at batch 1, 0.5% beyond; a clear loss is tried less often than a near
tie, within 1x-64x `probe_every`; beyond batch 1 each probe in a row lost at the same load doubles that, up to
8x), and at once when the batch is smaller than any tried so far (a lower load level,
where speculation gains more) or, at a batch size other than the one fallback began at, speculation measured
faster there (a ragged end's small batches must not hold back the next full batch). Its drafts start as deep
as speculation last went. A trial whose batch moves to another size where speculation measured slower ends
there, in fallback (a ragged end's trial must not run on into the next full batch). A batch made mostly of new
requests gets a trial too while speculating (unless speculation measured slower at about its size: then it
neither gets one nor drafts over its prompts), and in fallback at batch 1 (each request):
requests differ widely (some accept ten drafts a step, most one or two), and a fixed K takes the
easy ones for free. Such a trial of a request alone in its batch times `alone_trial_steps` steps (16), not
`probe_steps`: a few steps' acceptance says little about a request's next sixty tokens (the demo's 64 held-out
prompts at K=4: their first four steps put 25 requests on the wrong side of this machine's break-even, 1.85
tokens a step, sixteen steps 8 of 58), and at batch 1 a request that falls back stays so for its life (c=1
replays at this machine's latest costs: 0.96 -> 0.99 of the best fixed K on other prompts). What those trials
at batch 1 gain, each with the stretch of speculation it opens
(plain time for the tokens emitted, less the time taken), is kept; where it is negative on balance
(no request pays), new requests get no trial of their own in fallback, and the spaced probes keep the
figure measured. A new request that would be half its batch or more reserves drafts when such a
trial may come, so that the head drafts over its prompt (else its KV would miss it). While
speculating, an exploration forces `explore_steps` plain steps every `explore_every` steps and soon
after a trial, and times plain decoding afresh by them, as a trial does speculation (all but the
first, which follows a draft, are timed: a plain figure timed in a slow spell of the machine must
not keep a losing speculation going; until they are timed, no other batch size's figures decide);
plain steps are also forced at a batch size whose plain speed is not measured yet.

KV lookahead follows each request's own K: `reservation` says how many drafts a request may get at
its next choice (at most twice its last K, so K can grow step by step; 0 in fallback until a probe,
which starts from the K speculation last used), the scheduler reserves draft-head slots for that
many only, the head drafts only as deep as the deepest reservation, and `choose` never exceeds what
was reserved.

In steady fallback most steps skip the controller altogether: `FallbackHold` keeps their time and gives it to
the controller at the next choice, once per `HOLD_STEPS` + 1 steps of the same batch.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

PRIOR_DECAY = 0.97  # weight of the past in the all-request prior, per observation
PLAIN_DECAY = 0.8  # plain steps vary in time only: a few recent ones say what plain decoding costs now
TIE = 0.05  # speeds within this fraction of each other are a tie: the current regime stays
REFIT_EVERY = 8  # observations between two solves of the cost fit
REWEIGH_EVERY, REWEIGH_FROM = 4, 4  # batches of 4 or more keep their weighing's outcome for 4 steps (`_weigh`)
# share of time probes may cost while plain decoding measures faster, at batch 1 and beyond: at batch 1
# speculation gains most, and a request a slow spell of the machine sent into fallback is lost for long
# (at 0.5% a noisy batch-1 stream kept 0.88 of the best fixed K, at 2% 0.89); at larger batches 2% cost
# the demo 2-3% of plain decoding's speed at concurrency 4-64 in replays of its measured acceptance and
# step costs (scripts/replay_depth.py), 0.5% some 1%, with the same gains where speculation pays
PROBE_BUDGET = (0.02, 0.005)
VALUE_DECAY = 0.9  # weight of the past in what arrival trials gained, per trial: rare large gains must weigh in
VALUE_TRIALS = 4  # arrival trials measured before their value may stop them
# beyond batch 1, each probe in a row at the same batch-size bucket whose stretch of speculation gained no more
# than a tie (`_count_lost_probe`) doubles the next interval, up to 2**MAX_BACKOFF times: a trial there costs more
# than its own steps (the requests it sped up fall out of step with the rest: in the engine at c=4 a round with
# a probe ran 5-30% below plain, where its steps alone cost some 3%), and where speculation keeps losing, each
# probe says so again
MAX_BACKOFF = 3
# a long trial (`alone_trial_steps`) whose first `probe_steps` steps measure speculation slower than plain decoding
# by more than this ends there: where drafting is hopeless each new request's long trial would cost some 16 steps,
# and a request that slow rarely turns (a simple model of the demo's held-out prompts at K=4: a trial cut there
# keeps all that the long trials gain, one cut at a quarter slower half of it)
CLEAR_LOSS = 1 / 3
RESCALE = 1e64  # lazily decayed counts (`_Counts`) are brought back to scale 1 beyond this
HOLD_STEPS = 7  # steps a batch held in fallback goes without a choice at most (`FallbackHold`)


@dataclass
class DepthOptions:
    max_k: int
    min_k: int = 0
    probe_every: int = 16  # fewest steps between two probes (near ties); at most 64x as many
    probe_k: int = 2
    probe_steps: int = 4  # steady speculative steps a probe (a trial of speculation) times
    alone_trial_steps: int = 16  # the same for a new request's own trial, alone in its batch (see the module's doc)
    explore_every: int = 128  # plain steps are forced this often while speculating
    explore_steps: int = 4  # plain steps an exploration forces
    decay: float = 0.9  # weight of the past per observation (per request)
    prior_weight: float = 2.0  # pseudo-observations of the global prior in each request's estimate

    def __post_init__(self) -> None:
        if not 0 <= self.min_k <= self.max_k:
            raise ValueError(f"min_k must lie in 0..max_k ({self.max_k}), got {self.min_k}")


@dataclass(slots=True)
class Step:
    """One engine step as the scheduler saw it (slots, not frozen: made once per engine step, where a frozen
    dataclass's construction cost four times as much)."""

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


@dataclass(slots=True)
class _Speed:
    """Tokens per request-second of one kind of step, from decayed sums (recent steps weigh more)."""

    decay: float = 0.9  # some 10 steps; speculative steps count their expected tokens (see the module's doc)
    tokens: float = 0.0
    request_seconds: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0

    def add(self, tokens: float, requests: int, seconds: float) -> None:
        """One step of `requests` requests that took `seconds` and yields `tokens`."""
        decay = self.decay
        self.tokens = self.tokens * decay + tokens
        self.request_seconds = self.request_seconds * decay + requests * seconds
        self.seconds = self.seconds * decay + seconds
        self.steps = self.steps * decay + 1.0

    @property
    def value(self) -> float | None:
        return self.tokens / self.request_seconds if self.request_seconds > 0 else None

    @property
    def step_seconds(self) -> float | None:
        """How long one such step lasts (recent steps weigh more)."""
        return self.seconds / self.steps if self.steps > 0 else None


@dataclass(slots=True)
class _Counts:
    """Decayed tries and hits per draft position, decayed lazily: kept as the true counts x `scale`, which
    grows by 1/decay per observation, so that an observation adds to the positions it reached and no others
    (decaying every position of every request each step was most of the acceptance update's time)."""

    tries: list[float]
    hits: list[float]
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
class _Stats:
    counts: _Counts  # the request's own acceptance
    last_k: int | None = None


@dataclass
class CostModel:
    """Step seconds, fitted online: s0 + s1 T + dv V + s2 D for a step that runs the draft (T tokens
    computed, V of them verified drafts, D draft rows), p0 + s1 T for a plain one (no draft). One decayed
    least-squares fit over both kinds, with a small ridge towards the current fit (steady when a feature
    barely varies, e.g. p0 through a long stretch of speculation): the per-token cost s1 is shared, so plain
    steps, whose batch sizes vary most, pin it down for speculation's choices too (fitted on speculative
    steps alone it came out at a third of the true cost at batch 64, and trials drafted far too deep). A
    verified draft costs s1 + dv, where dv (which may be negative) is what it costs beyond a request's
    token: its ridge pulls it towards 0, so a draft is priced as a request's token until steps that vary
    the verified drafts apart from the batch size say otherwise (one more position of a request already
    computed can cost a third of a new request's token; one price for both made drafts look dear, and a
    GPU-like replay at c=8-64 ran 3-4% slower). Exposed as sb = s1 per request, sv = s1 + dv per verified
    draft. No cost comes out negative (dv is held at -s1 at most): a term that
    would is held at 0 and the others are fitted again (clipping it afterwards left the others fitted
    around a negative term: at batch 1, where verified tokens and draft rows rise together, a recorded
    engine's plain step was priced at 8.7 ms against 3.5 measured). Until a plain step is seen, p0 is
    taken as s0 (the draft path assumed free: speculation is tried first). The fit is solved when a
    prediction is asked for, not per step (in fallback none is, and a step costs only the sums), and
    then only once `REFIT_EVERY` observations are new: the decayed fit moves little in a few steps, and
    solving it each step was a sixth of a choice's cost at batch 1, itself 2% of a speculative step. Solved on
    floats (5 x 5 at most): with numpy a solve took 170 us, 20 us a step at every 8th."""

    decay: float = 0.98
    ridge: float = 1e-6
    _s: list[float] = field(default_factory=lambda: [1e-2, 1e-4, 0.0, 1e-5])  # s0, s1, dv, s2
    _p0: float | None = None
    # decayed sums of x x^T and x y over features x = (draft ran, plain, T, V, D), as floats: a step in fallback
    # costs these sums only, and numpy's per-call overhead was most of a fallback step's controller time; decayed
    # lazily (kept x `_scale`, which grows by 1/decay per step, as `_Counts` does), so that a step adds to the
    # entries its features reach and no others (a plain step's are 3 of 25)
    _xx: list[float] = field(default_factory=lambda: [0.0] * 25)
    _xy: list[float] = field(default_factory=lambda: [0.0] * 5)
    _scale: float = 1.0
    _seen: int = 0
    _new: int = 0  # observations since the fit was last solved

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
        if scale > RESCALE:
            self._xx, self._xy, self._scale = [v / scale for v in xx], [v / scale for v in xy], 1.0
        self._seen += 1
        self._new += 1

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
        """[s0, sb, sv, s2] of the current fit: sb a request's token, sv a verified draft's (s1 + dv)."""
        return np.array(self.terms()[:4])

    @property
    def p0(self) -> float | None:
        """A plain step's fixed cost; None before any plain step was seen."""
        self._solve()
        return self._p0

    def terms(self) -> tuple[float, float, float, float, float]:
        """(s0, sb, sv, s2, plain) as floats, plain being p0 (s0 before any plain step was seen): a step
        drafting D rows and verifying V drafts over B requests costs s0 + s2 D + sb B + sv V, a plain one
        plain + sb B."""
        self._solve()
        s0, s1, dv, s2 = self._s
        return s0, s1, s1 + dv, s2, (s0 if self._p0 is None else self._p0)


def _solve_linear(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b (a square and regular: here a positive definite normal matrix), by Gaussian elimination
    with partial pivoting."""
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


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _bucket(batch: int) -> int:
    """Batch sizes within a factor of two share their speed figures."""
    return max(batch, 1).bit_length()


class _Curves:
    """A batch's acceptance curves, P_r(i) = the probability that request r's first i drafts are all accepted,
    computed only as far as they are asked for: the first of each, then (`reaching_at`) depth by depth for the
    requests whose drafts may still count, then further only for ties and short drafts. On floats, in plain
    loops: most of the B x K_max drafts never count, and numpy's per-call overhead was most of a choice's time
    in the engine."""

    __slots__ = ("rows", "prior", "kmax", "values", "_counts", "_weight")

    def __init__(self, rows: list[tuple[list[float], list[float], float]], prior: _Counts, prior_weight: float,
                 kmax: int) -> None:
        self.rows = rows  # per request: its decayed hits, tries (`_Counts`), and the prior's weight on their scale
        self.kmax, self._counts, self._weight = kmax, prior, prior_weight * prior.scale
        self.prior: list[float] = []  # the prior's rates, as far as computed (`_prior_to`)
        self._prior_to(1)
        p0 = self.prior[0]
        self.values = [[min((hits[0] + w * p0) / (tries[0] + w), 1.0)] for hits, tries, w in rows]

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
        their P_r(d); computed where missing: the weighing goes depth by depth, and a call per value, or a
        list of them, cost more than the arithmetic."""
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
            p *= rate if rate < 1.0 else 1.0  # min() is a call: twice the time of this loop's arithmetic
            values.append(p)
            i += 1


class DepthController:
    """Per-request K from online acceptance statistics and a fitted step-cost model."""

    def __init__(self, options: DepthOptions) -> None:
        self.opt = options
        k = options.max_k
        self.requests: dict[str, _Stats] = {}
        self.prior = _Counts([0.0] * k, [0.0] * k)  # all requests' acceptance, one observation after another
        self._zeros = [0.0] * k  # the counts of a request not seen yet
        self.cost = CostModel()
        # draft rows per request of a step whose deepest choice is d drafts (`_lookahead`; none at d = 0)
        self._lookahead_rows = [0] + [self._lookahead(d) for d in range(1, k + 1)]
        self.typical_k = k  # largest K of the latest choice: what a new request may start from
        self.spec_k = k  # largest K of the latest speculative choice: where a probe starts
        self.steps = 0  # choices made: the clock of probes and exploration
        self.speculating = True  # whether the latest choice found drafting worth its cost
        self.probe_interval = options.probe_every  # steps from entering fallback to the next probe
        self.early_interval = options.probe_every  # the same at PROBE_BUDGET[0]: sets the earliest probe
        self.next_probe = options.probe_every
        self.earliest_probe = options.probe_every // 2  # the next probe comes no earlier (see _schedule_probe)
        self.trial_left = options.probe_steps  # steady speculative steps the current trial still has to time
        self.trial_length = options.probe_steps  # the steps it times in all
        self.probe_until = 4 * options.probe_steps  # the current trial's last step at the latest
        self.plain_left = 0  # exploration's forced plain steps still to come
        self.next_explore = options.explore_every  # step of the next exploration while speculating
        self.plain_forced = False  # the latest choice forced a plain step: reserve nothing, so no draft runs
        # per batch-size bucket: speeds of steady plain and steady speculative steps
        self.speeds: dict[int, tuple[_Speed, _Speed]] = {}
        self.summarized = 0  # `steps` at the latest summary
        self._last = (False, False)  # the latest step opened a stretch of speculation; it ran a draft
        self._expected = 1.0  # tokens per request the latest choice's drafts are expected to emit
        self.tried: set[int] = set()  # batch-size buckets where a trial of speculation has run
        self.fallback_bucket = 0  # batch-size bucket at which the latest fallback began
        self.trial_step = 0  # step at which the latest trial began
        self.trial_bucket = 0  # batch-size bucket at which it began (the engine's start: its first batch's)
        # at batch 1: seconds a trial gained, its stretch included (decayed mean), and trials measured
        self.trial_value: tuple[float, int] = (0.0, 0)
        self.lost_probes: dict[int, int] = {}  # per batch-size bucket beyond 1: probes lost in a row there
        # the latest probe beyond batch 1: its bucket, and the seconds its stretch of speculation gained and took so
        # far (None once that stretch is over)
        self._probe: tuple[int, float, float] | None = None
        self._stretch: float | None = None  # seconds gained so far by the latest trial at batch 1
        self._held: tuple[str, ...] = ()  # the batch of the latest choice, when it held the batch in fallback
        self._quiet_at = -1  # step of the latest choice that held its batch in fallback with nothing due
        # the latest weighing (`_weigh`): its batch size, step, threshold and depth
        self._weighed: tuple[int, int, float, int] = (0, 0, np.inf, 0)

    def observe(self, req_ids: list[str], num_drafts: list[int], num_accepted: list[int]) -> None:
        """A step's verification results: request i's drafts 1..num_accepted[i] accepted, the next one
        rejected (requests that verified no draft are skipped). The prior takes them one after another."""
        decay, prior = self.opt.decay, self.prior
        for req_id, drafts, accepted in zip(req_ids, num_drafts, num_accepted):
            if drafts > 0:
                seen = min(accepted + 1, drafts)
                self._stats(req_id).counts.add(seen, accepted, decay)
                prior.add(seen, accepted, PRIOR_DECAY)

    def _stats(self, req_id: str) -> _Stats:
        s = self.requests.get(req_id)
        if s is None:
            k = self.opt.max_k
            s = self.requests[req_id] = _Stats(_Counts([0.0] * k, [0.0] * k))
        return s

    def observe_step(self, step: Step) -> None:
        """One engine step: it fits the cost model, and the measured speed of steady plain steps and
        of steady speculative ones (see the module's doc) decides between the two. Steps with a
        prompt in them are left out of both: a prefill in a plain stretch would make plain look slow,
        and its thousands of tokens, cheaper each than a decode step's, would set the per-token cost
        that prices verification."""
        (opened, drafted), self._last = self._last, (bool(step.draft_rows and not step.verified), bool(step.draft_rows))
        if step.seconds <= 0 or not step.emitted or not step.decode_only:
            return
        self.cost.observe(step.requests, step.tokens, step.draft_rows, step.seconds)
        bucket = _bucket(step.requests)
        speeds = self.speeds.get(bucket)
        if speeds is None:
            speeds = self.speeds[bucket] = (_Speed(PLAIN_DECAY), _Speed())
        plain, spec = speeds
        if step.draft_rows and plain.value is not None and (self._stretch is not None or self._probe is not None):
            # seconds plain decoding would take for the step's tokens, less the step's own
            gained = step.emitted / (step.requests * plain.value) - step.seconds
            if self._stretch is not None:
                self._stretch += gained
            if self._probe is not None:
                bucket_of_probe, probe_gained, probe_seconds = self._probe
                self._probe = (bucket_of_probe, probe_gained + gained, probe_seconds + step.seconds)
        if step.draft_rows and step.verified and not opened:
            spec.add(self._expected * step.requests, step.requests, step.seconds)
            self.trial_left = max(self.trial_left - 1, 0)
        elif not step.draft_rows and not step.verified and not drafted:
            plain.add(step.emitted, step.requests, step.seconds)

    def _measured_speeds(self, batch: int) -> tuple[float, float] | None:
        """(plain, speculative) tokens per request-second at about this batch size (see `_measured`)."""
        speeds = self._measured(batch)
        return None if speeds is None else (speeds[0].value, speeds[1].value)

    def _measured(self, batch: int) -> tuple[_Speed, _Speed] | None:
        """The (plain, speculative) figures at about this batch size (per-request speed falls with the
        batch: only like is compared with like; the nearest measured bucket stands in until this one
        is, the larger of two as near: speculation gains less at larger batches, and a wrong
        speculation costs more than a wrong fallback); None before both are measured."""
        own = self.speeds.get(_bucket(batch))
        if own is not None and own[0].value is not None and own[1].value is not None:
            return own  # the nearest (asked for at every step, in fallback too)
        measured = [b for b, (p, s) in self.speeds.items() if p.value is not None and s.value is not None]
        if not measured:
            return None
        return self.speeds[min(measured, key=lambda b: (abs(b - _bucket(batch)), -b))]

    def speculation_measured_faster(self, batch: int) -> bool | None:
        """Whether speculation measures faster than plain decoding at about this batch size; within
        `TIE` of each other the current regime stands (switching costs a step each way); None before
        both are measured."""
        speeds = self._measured_speeds(batch)
        if speeds is None:
            return None
        plain, spec = speeds
        if abs(spec - plain) <= TIE * plain:
            return self.speculating
        return spec > plain

    def _trial_cost(self, batch: int) -> float | None:
        """Plain steps a trial loses at about this batch size, at the measured speeds (None before both
        are measured). A speculative step lasts `stretch` plain steps and yields the tokens of spec/plain
        of them: each of the trial's timed steps loses stretch x (1 - spec/plain) plain steps, the opening
        step (it drafts, verifies nothing) stretch - 1, and the first plain step after it about one
        (measured at c=16 here: a speculative step lasts 5 plain steps, so a trial lost some 16 plain
        steps, where counting its steps as plain ones had said 8)."""
        speeds = self._measured(batch)
        if speeds is None:
            return None
        plain, spec = speeds
        stretch = max(spec.step_seconds / plain.step_seconds, 1.0)
        return self.opt.probe_steps * stretch * max(1.0 - spec.value / plain.value, 0.0) + stretch

    def _fallback_interval(self, batch: int, budget: float) -> int:
        """Steps in fallback before the next probe: a trial's cost over `budget`, so that probing costs
        about that share of the time (clear losses are probed less often than near ties); within 1x-64x
        `probe_every`."""
        lost = self._trial_cost(batch)
        if lost is None:
            return self.opt.probe_every
        return int(np.clip(lost / budget, self.opt.probe_every, 64 * self.opt.probe_every))

    def _count_lost_probe(self) -> None:
        """On leaving speculation: the stretch the latest probe beyond batch 1 opened is over. Unless it gained more
        than `TIE` of its time (plain time for its tokens less its own, its opening step included), it is one more
        probe lost in a row at its bucket (`MAX_BACKOFF`); one that did ends the row. A tie is lost: beyond batch 1
        a stretch costs more than its steps (see `MAX_BACKOFF`). Counting only probes whose trial itself ended in
        fallback, a trial won by the noise of a few steps, or a new batch's trial within its stretch, started the
        backoff afresh: in the engine at c=4, nine probes in 30 rounds, where speculation ran near a tie."""
        if self._probe is not None:
            bucket, gained, seconds = self._probe
            self.lost_probes[bucket] = self.lost_probes.get(bucket, 0) + 1 if gained <= TIE * seconds else 0
            self._probe = None

    def _in_trial(self, step: int) -> bool:
        """Whether the current trial still times speculation at `step`."""
        return self.trial_left > 0 and step <= self.probe_until

    def _arrival_trial_due(self, step: int, batch: int) -> bool:
        """Whether a batch made mostly of new requests gets a trial at `step`: their acceptance is unknown,
        and requests differ widely (some accept ten drafts a step, most one or two). While speculating,
        every new batch gets one, unless speculation measured slower at about its size (a batch size it
        came back to, as at concurrency 16 when a ragged end's small batches had speculated: each new
        batch of 16 paid a trial, its prompts drafted over, some 10% of the engine's time); in fallback,
        only a request alone in its batch (batch 1), while trials there have paid on balance (what the
        ones that found easy requests gained outweighs what the others lost) or `VALUE_TRIALS` were not
        measured yet; never within `probe_every` steps of the latest trial. At larger batches a trial in
        fallback cost more than its timed steps: requests that speculated fell out of step with the rest,
        and the batch ended ragged (replays of the demo at concurrency 4: 0.92 of plain decoding's speed
        with such trials, 0.97 without, where trial values read positive); the spaced probes keep
        speculation's figure there."""
        if step < self.trial_step + self.opt.probe_every:
            return False
        if self.speculating:
            return self.speculation_measured_faster(batch) is not False
        value, trials = self.trial_value
        return batch == 1 and (value >= 0.0 if trials >= VALUE_TRIALS else True)

    def _trial_left_behind(self, batch: int) -> bool:
        """The batch has moved, during a trial, to another batch-size bucket where speculation measured slower
        (a ragged end's trial at batch 1 as the next 64 requests arrive): the trial times nothing at its own
        size any more, and every step of it there loses (at concurrency 64 here, each round's tail trial ran
        on into the next round: 14 of 389 steps drafted, at about twice a plain step's time, besides the new
        requests' prompts drafted over)."""
        return _bucket(batch) != self.trial_bucket and self.speculation_measured_faster(batch) is False

    def _long_trial_lost(self, batch: int) -> bool:
        """A trial longer than `probe_steps` has timed that many, and speculation measures slower than plain decoding
        by more than `CLEAR_LOSS`: it ends as a probe's trial would."""
        if self.trial_length - self.trial_left < self.opt.probe_steps:  # (a probe's trial is over by then)
            return False
        speeds = self._measured_speeds(batch)
        return speeds is not None and speeds[1] < (1 - CLEAR_LOSS) * speeds[0]

    def _leave_trial(self, bucket: int) -> None:
        """Ends the current trial unfinished, straight into fallback at `bucket`; the next probe one interval on (a
        probe's stretch is counted at the probe's own bucket)."""
        self.trial_left, self.speculating, self.fallback_bucket = 0, False, bucket
        self._schedule_probe()
        self._close_stretch()
        self._count_lost_probe()

    def _close_stretch(self) -> None:
        """The latest trial's stretch of speculation is over: what it gained joins the trial value."""
        if self._stretch is not None:
            value, trials = self.trial_value
            value = self._stretch if trials == 0 else value
            self.trial_value = (VALUE_DECAY * value + (1 - VALUE_DECAY) * self._stretch, trials + 1)
            self._stretch = None

    def _schedule_probe(self) -> None:
        """The next probe one interval from now; plain decoding measured slower than speculation last was
        brings it forward, but by half the interval at most: the machine's speed drifts by a third
        within seconds, and a plain figure timed in a slow spell would otherwise call trial after trial."""
        self.next_probe = self.steps + self.probe_interval
        self.earliest_probe = self.steps + self.early_interval // 2

    def _plain_unmeasured(self, batch: int) -> bool:
        """No plain decode step has been timed at about this batch size yet (a new load level)."""
        speeds = self.speeds.get(_bucket(batch))
        return speeds is None or speeds[0].value is None

    def forget(self, req_id: str) -> None:
        self.requests.pop(req_id, None)

    def _curves(self, req_ids: list[str]) -> _Curves:
        """The batch's acceptance curves, each rate shrunk towards the prior's by `prior_weight`
        pseudo-observations (a request not seen yet: the prior alone)."""
        w, zeros, rows = self.opt.prior_weight, self._zeros, []
        for rid in req_ids:
            s = self.requests.get(rid)
            rows.append((zeros, zeros, w) if s is None else (s.counts.hits, s.counts.tries, w * s.counts.scale))
        return _Curves(rows, self.prior, self.opt.prior_weight, self.opt.max_k)

    def reservation(self, req_id: str, batch: int | None = None) -> int:
        """Most drafts this request may be given at its next choice (and lookahead to reserve for).
        `batch`: the size of the batch it is about to join, for a new request (the engine's running and
        waiting requests, up to its limit; by default the requests seen so far and this one)."""
        s = self.requests.get(req_id)
        last = self.typical_k if s is None or s.last_k is None else s.last_k
        plain_next = last == 0 and self._fallback_next()
        if s is None:
            size = len(self.requests) + 1 if batch is None else max(batch, 1)
            if plain_next and 2 * (size - len(self.requests)) >= size and self._arrival_trial_due(self.steps + 1, size):
                plain_next = False  # new requests, half the batch or more: their trial may start with their prompts
            elif self.speculating and (self._trial_left_behind(size) if self._in_trial(self.steps + 1)
                                       else self.speculation_measured_faster(size) is False):
                # the next choice falls back (no arrival trial where speculation measured slower, a trial at
                # another size is left): drafting over the prompt would be for nothing (at concurrency 16 here,
                # a third of the prefill step's time)
                plain_next = True
        if self.plain_forced or plain_next:
            return self.opt.min_k  # exploring, or in fallback with no probe due: plain decoding next step
        if last == 0:  # a request back from K=0 starts where speculation stood
            return int(min(self.opt.max_k, max(self.spec_k, self.opt.probe_k, self.opt.min_k)))
        return self._lookahead(last)

    def _fallback_next(self) -> bool:
        """In fallback, with no probe due at the next step."""
        return not self.speculating and self.steps + 1 < self.next_probe

    def plain_next(self) -> bool:
        """Whether every request at K=0 now is reserved nothing for the next step, as `reservation` says for
        each (exploring, or in fallback with no probe due, and `min_k` 0): the engine, which asks for a
        reservation per request and step, need not ask then."""
        return self.opt.min_k == 0 and (self.plain_forced or self._fallback_next())

    def _lookahead(self, k: int) -> int:
        """Drafts reserved for a request whose K is now k (> 0): up to twice as many, so that K can grow
        step by step; the head drafts that deep in the next step, whatever K is then chosen."""
        return min(self.opt.max_k, max(2 * k, self.opt.probe_k, self.opt.min_k))

    def _best_drafts(self, curves: _Curves, speculate: bool) -> tuple[float, int]:
        """(threshold, depth): the drafts kept are those at most `depth` deep whose acceptance probability
        reaches `threshold`, the pair maximising expected tokens per predicted second ((inf, 0): a plain step,
        not a candidate when `speculate`). The next step drafts its whole batch as deep as its deepest draft
        reserves, so at each depth d the draft cost is fixed and the best drafts within it lie above a
        threshold: Dinkelbach's iteration finds them (the drafts with P >= sv S have the most tokens - S seconds
        of any set; while their speed beats S, it is the next S). Each depth is weighed only for what it may add
        to the best speed so far (the drafts reaching sv times it), and the weighing stops at the depth none
        reaches (P falls with depth: no deeper one does either); curves are computed depth by depth, only for
        requests whose draft before reached that bar. Weighing each depth, not only the top-n drafts overall
        (whose deepest draft, often one easy request's, sets every request's draft rows), lets a batch draft 1-2
        deep where one request alone would take it to 8: in replays at 0.35 of this machine's draft cost, 0.91
        -> 0.95 of the best fixed K at c=64, 0.94 -> 0.95 at c=16 (c=2-8 within about 1% of before)."""
        b = len(curves.values)
        if b == 1:
            return self._best_depth_alone(curves, speculate)
        s0, sb, sv, s2, plain = self.cost.terms()
        lookahead, per_request = self._lookahead_rows, sb * b
        best, threshold, depth = (-np.inf, np.inf, 0) if speculate else (b / max(plain + per_request, 1e-9), np.inf, 0)
        # the likeliest draft (a first one) alone: the best there is where each draft costs more than it yields
        top = max(curve[0] for curve in curves.values)
        one = (b + top) / max(s0 + s2 * (b * lookahead[1]) + per_request + sv, 1e-9)
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
                seconds = base + sv * n
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

    def _best_depth_alone(self, curves: _Curves, speculate: bool) -> tuple[float, int]:
        """`_best_drafts` for a batch of one request, whose candidate sets are its first d drafts: depth by depth
        in one loop, up to the first draft below sv x the best speed so far (the same stopping rule), without the
        batch's bookkeeping (on session 13's recorded c=1 engine trace a choice took 40 us, 22 with this loop, for
        the same K at every step). The threshold is the deepest kept draft's probability."""
        s0, sb, sv, s2, plain = self.cost.terms()
        lookahead, values, kmax = self._lookahead_rows, curves.values[0], curves.kmax
        best, threshold, depth = (-np.inf, np.inf, 0) if speculate else (1.0 / max(plain + sb, 1e-9), np.inf, 0)
        tokens, base = 1.0, s0 + sb
        for d in range(1, kmax + 1):
            if d > len(values):
                curves.extend(0, min(2 * d, kmax))
            p = values[d - 1]
            if p < sv * best and d > 1:  # (a first draft changes the step's fixed cost too: always weighed)
                break
            tokens += p
            seconds = base + s2 * lookahead[d] + sv * d
            speed = tokens / (seconds if seconds > 1e-9 else 1e-9)
            if speed > best:
                best, threshold, depth = speed, p, d
        return threshold, depth

    def _weigh(self, curves: _Curves, req_ids: list[str], faster: bool | None, in_trial: bool) -> tuple[float, int]:
        """`_best_drafts`, or at a batch of `REWEIGH_FROM` requests or more, of the size the latest weighing saw,
        while speculation measures faster (outside trials), that weighing's threshold and depth for
        `REWEIGH_EVERY` steps: each request's K still follows its own curve, and the weighing was most of a
        choice's time (in the engine at c=16 235 of 352 us, at c=64 506 of 785, 0.6% of a step). A few steps
        late, a threshold set by many requests moves little, and one of them ending and another joining
        changes it little (a batch mostly new gets a trial, and is weighed): replays at c=4-64 within 1% of
        weighing every step, c=64 at 0.35 of the draft cost 1.5% faster. At smaller batches the weighing is
        cheap, and a stale threshold cost up to 2% (GPU-like replays at c=1-2)."""
        size, (weighed_size, at, kept, depth) = len(req_ids), self._weighed
        if (size >= REWEIGH_FROM and faster and not in_trial and kept < np.inf
                and self.steps - at < REWEIGH_EVERY and size == weighed_size):
            return kept, depth
        threshold, depth = self._best_drafts(curves, speculate=bool(faster))
        self._weighed = (size, self.steps, threshold, depth)
        return threshold, depth

    def choose(self, req_ids: list[str], caps: list[int] | None = None) -> list[int]:
        """K for each request of this step's batch; `caps` (e.g. the drafts whose KV slots were
        reserved) bound each request's K from above."""
        if not req_ids:
            return []
        self.steps += 1
        if self._quiet_fallback(req_ids):
            self._quiet_at = self.steps
            return self._stay_in_fallback(req_ids)
        kmax = self.opt.max_k
        bucket = _bucket(len(req_ids))
        if self.steps == 1:
            self.trial_bucket = bucket
        smaller = self._smaller_than_tried(bucket)
        arrival = self._arrival_trial(req_ids)
        # a batch size other than the one fallback began at, where speculation measured faster: probed now
        moved = (not self.speculating and bucket != self.fallback_bucket
                 and self.speculation_measured_faster(len(req_ids)))
        probe = not self.speculating and (self.steps >= self.next_probe or smaller or moved)
        trial = probe or arrival
        if trial:  # speculation runs at the model's K until its speed is timed afresh
            timed = self.opt.probe_steps if probe or len(req_ids) > 1 else self.opt.alone_trial_steps
            self.trial_left, self.trial_length, self.probe_until = timed, timed, self.steps + 4 * timed
            self.trial_step, self.trial_bucket = self.steps, bucket
            if probe and bucket > 1:
                self._probe = (bucket, 0.0, 0.0)
            self._close_stretch()
            if len(req_ids) == 1:  # what the trial gains, its stretch of speculation included, is measured
                self._stretch = 0.0
            if not self.speculating:
                self._schedule_probe()  # (again when the trial ends in fallback)
                self.next_explore = self.probe_until + self.opt.probe_every  # a trial won is checked soon
            speeds = self.speeds.get(bucket)
            if speeds is not None:
                self.speeds[bucket] = (speeds[0], _Speed())
        in_trial = self._in_trial(self.steps)
        if in_trial and not trial and self._trial_left_behind(len(req_ids)):
            self._leave_trial(bucket)
            in_trial = False
        elif in_trial and self._long_trial_lost(len(req_ids)):
            self.trial_left, in_trial = 0, False  # decided as a probe's trial is (below)
        if in_trial:
            self.tried.add(bucket)
        # measured speeds overrule the model (whose costs may be biased) both ways, outside trials and
        # explorations (whose plain figure is being timed afresh: a neighbouring batch size's figures would
        # stand in meanwhile); a trial that measures a tie keeps speculating (see the module's doc)
        faster = True if in_trial or self.plain_left else self.speculation_measured_faster(len(req_ids))
        if faster and not self.speculating and not in_trial:
            # in fallback only a trial resumes speculation: its figure may be stale and plain decoding
            # timed in a slow spell of the machine (both sides must be timed alike); the trial comes early
            self.next_probe = min(self.next_probe, max(self.steps + self.opt.probe_every, self.earliest_probe))
            faster = False
        if faster is False and not self.speculating and not self.opt.min_k:
            return self._stay_in_fallback(req_ids)
        curves = self._curves(req_ids)
        threshold, depth = self._weigh(curves, req_ids, faster, in_trial)
        if faster is False:
            threshold = np.inf
        if self.speculating and threshold == np.inf:  # entering fallback: the first probe comes one interval later
            self.fallback_bucket = bucket
            self._count_lost_probe()
            backoff = 2 ** min(self.lost_probes.get(bucket, 0), MAX_BACKOFF)
            self.probe_interval = backoff * self._fallback_interval(len(req_ids), PROBE_BUDGET[len(req_ids) > 1])
            # the early probe, when speculation measures faster, comes as soon as at batch 1's budget
            self.early_interval = backoff * self._fallback_interval(len(req_ids), PROBE_BUDGET[0])
            self._schedule_probe()
            self._close_stretch()
        self.speculating = threshold < np.inf
        self.plain_left, self.plain_forced = max(self.plain_left - 1, 0), False
        if self.speculating:  # plain steps keep plain decoding's speed measured (see the module's doc)
            if not in_trial and self.steps >= self.next_explore:
                self.plain_left, self.next_explore = self.opt.explore_steps, self.steps + self.opt.explore_every
                if bucket in self.speeds:  # plain decoding timed afresh, as a trial times speculation
                    self.speeds[bucket] = (_Speed(PLAIN_DECAY), self.speeds[bucket][1])
            if self.plain_left or self._plain_unmeasured(len(req_ids)):
                threshold, self.plain_forced = np.inf, True
        short = min(self.opt.probe_k, kmax) if trial and not self.plain_forced else 0  # where the model says no
        caps = [kmax] * len(req_ids) if caps is None else caps
        out, self._expected = self._ks(curves, threshold, depth, short, caps)
        requests, self._held = self.requests, ()
        for rid, k in zip(req_ids, out):
            (requests.get(rid) or self._stats(rid)).last_k = k
        self.typical_k = max(out)
        if self.speculating and self.typical_k:
            self.spec_k = self.typical_k
        return out

    def _ks(self, curves: _Curves, threshold: float, depth: int, short: int,
            caps: list[int]) -> tuple[list[int], float]:
        """Each request's K: its drafts at most `depth` deep whose acceptance probability reaches `threshold`
        (at least min_k; 0 becomes `short`, a trial's short draft), within `caps`; and the tokens per request
        they are expected to emit (one, and each request's probabilities over its kept drafts)."""
        ks, expected, min_k = [], 0.0, self.opt.min_k
        for r, cap in enumerate(caps):
            k = min(max(curves.reaching(r, threshold, depth), min_k) or short, cap)
            if k:
                expected += sum(curves.prefix(r, k))
            ks.append(k)
        return ks, 1.0 + expected / len(ks)

    def _quiet_fallback(self, req_ids: list[str]) -> bool:
        """In fallback with nothing due at this step, so that the rest of `choose` would only keep it there:
        no probe or trial (none scheduled, no batch smaller than any tried, no arrival trial), and speculation
        measured slower at about this batch size (neither a tie, nor faster, which would bring the next probe
        forward, nor unmeasured), with `min_k` 0 (else fallback still drafts min_k); trials and explorations run
        only while speculating. Most steps at larger batches are such steps: checked first, they skip the rest
        (a step in fallback is the shortest there is)."""
        if self.speculating or self.opt.min_k or self.steps >= self.next_probe:
            return False
        batch = len(req_ids)
        if self._smaller_than_tried(_bucket(batch)) or self.speculation_measured_faster(batch) is not False:
            return False
        return not self._arrival_trial(req_ids)

    def quiet_steps(self) -> int:
        """Steps after this one that may hold the batch without a choice (`FallbackHold`): `HOLD_STEPS` after a
        choice that held it in fallback with nothing due, else none. (A probe's step is never held: its requests
        reserve drafts, so a draft runs in it.)"""
        return HOLD_STEPS if self._quiet_at == self.steps else 0

    def hold_step(self) -> None:
        """A step of a held batch (`FallbackHold`): the clock advances, nothing else changes."""
        self.steps += 1

    def _smaller_than_tried(self, bucket: int) -> bool:
        """The batch is smaller than any where speculation was tried (it gains most at small batches)."""
        return bucket < min(self.tried, default=bucket + 1)

    def _arrival_trial(self, req_ids: list[str]) -> bool:
        """A batch made mostly of new requests gets an arrival trial at this step (see `_arrival_trial_due`)."""
        return self._arrival_trial_due(self.steps, len(req_ids)) and \
            2 * sum(rid not in self.requests for rid in req_ids) >= len(req_ids)

    def _stay_in_fallback(self, req_ids: list[str]) -> list[int]:
        """`choose` for a batch in fallback with nothing due and `min_k` 0: K=0 for all, nothing to weigh."""
        self.plain_left, self.plain_forced = 0, False
        batch = tuple(req_ids)
        if batch != self._held:  # else the batch held at the step before: its requests are at K=0 already
            requests = self.requests
            for rid in req_ids:
                (requests.get(rid) or self._stats(rid)).last_k = 0
            self._held = batch
        self.typical_k, self._expected = 0, 1.0
        return [0] * len(req_ids)

    def summary(self) -> str:
        """One log line on the controller's state when it chose since the last call: speculating or in
        fallback, and the fitted step costs, whose draft terms are the measured cost of drafting (the
        chosen K themselves are counted by the engine figures, `peagle:chosen_k`)."""
        if self.steps == self.summarized:
            return ""
        self.summarized = self.steps
        (s0, sb, sv, s2), p0 = self.cost.s, self.cost.p0
        plain = "not measured yet" if p0 is None else f"{1e3 * p0:.2f} ms"
        speeds = ", ".join(f"{2 ** (b - 1)}-{2 ** b - 1}: {_rate(p.value)}/{_rate(sp.value)}"
                           for b, (p, sp) in sorted(self.speeds.items()))
        return (f"{'speculating' if self.speculating else 'fallback'}, probe interval {self.probe_interval} steps; "
                f"fitted step cost: plain {plain}, with the draft {1e3 * s0:.2f} ms + {1e3 * s2:.4f} ms/draft row, "
                f"+ {1e3 * sb:.3f} ms/request + {1e3 * sv:.3f} ms/draft verified; measured tokens per "
                f"request-second, plain/speculative, by batch size: "
                f"{speeds or 'none yet'}")


class FallbackHold:
    """Steps of a batch in steady fallback that skip the controller. After a choice that held its batch in fallback
    with nothing due (`DepthController.quiet_steps`), up to `HOLD_STEPS` following plain decode steps of the same
    batch are only kept (their time and emitted tokens) while the controller's clock advances; the first other
    step, or the schedule of one that may draft, gives them to the controller in order (`release`) before its own.
    Why: in the engine at concurrency 4 a step's observation and choice cost some 100 us of a 10 ms plain step,
    nearly all of it cache misses after the model's forward (the same calls back to back take 11 us); once per
    eight steps that is an eighth. What it costs: plain decoding timed slower (or faster) during a hold is seen at
    the next choice, up to `HOLD_STEPS` steps late, and a probe it brings forward comes that much later; where the
    speeds stay put, the controller probes at the same steps and ends in the same state as with a choice each step."""

    __slots__ = ("batch", "left", "kept")

    def __init__(self) -> None:
        self.batch: frozenset[str] = frozenset()
        self.left = 0  # steps the batch may still be held
        self.kept: list[tuple[float, int]] = []  # (seconds, emitted tokens) of each held step

    def start(self, controller: DepthController, req_ids: list[str]) -> None:
        """After `choose` for this batch: it is held for as many steps as the controller allows (none unless quiet)."""
        self.left = controller.quiet_steps()
        if self.left:
            self.batch = frozenset(req_ids)

    def holds(self, scheduled: Collection[str], tokens: int) -> bool:
        """Whether a step that scheduled these requests and `tokens` tokens (and ran no draft) is one more plain
        decode step of the held batch."""
        return self.left > 0 and tokens == len(self.batch) and scheduled == self.batch

    def keep(self, controller: DepthController, seconds: float, emitted: int) -> None:
        """A held step (see `holds`): kept for the controller, whose clock advances."""
        self.kept.append((seconds, emitted))
        self.left -= 1
        controller.hold_step()

    def release(self, controller: DepthController) -> int:
        """The kept steps to the controller, in order; the hold ends. Returns how many there were."""
        n, batch = len(self.kept), len(self.batch)
        for seconds, emitted in self.kept:
            controller.observe_step(Step(tokens=batch, draft_rows=0, seconds=seconds, requests=batch, emitted=emitted))
        self.kept.clear()
        self.left = 0
        return n
