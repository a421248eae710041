"""The adaptive-depth controller: each step, each request's K (0..K_max), and the regime that keeps its inputs true.

Measured speeds (`speeds`, of greedy and of sampled batches apart, as a sampled step costs more) decide between the
regimes: while speculation measures slower than plain decoding, every request is at K=0 (fallback: no draft runs at
all); while it measures faster, the optimiser picks each K; within `TIE` the current regime stays, and a trial ends
speculating (a request at batch 1 that falls back stays so for its life, often while its text grows predictable);
beyond batch 1 a tie whose drafts would reach a quarter of the batch or less falls back (the head would draft for the
whole batch to verify the likeliest few, often one draft where none pays). In
fallback only a trial resumes speculation: speculation's figure there is as old as its last stretch, and a slow spell of
the machine, slowing the plain steps timed now, would read as a gain. Timed are steady decode steps only: no prompt in
them, and none of a switch's steps (the first draft after plain steps, with nothing to verify and the head's catch-up,
the step after it, and the first plain step after a draft, which carries the last choice's bookkeeping and the blocks it
hands back); a step that drafts while every request is at K=0 is speculation's. A speculative step is credited with the
tokens its drafts were expected to yield when chosen: they vary far less than those accepted, so a few timed steps
suffice.

Trials time speculation afresh, at the K the optimiser picks, for `probe_steps` steady steps (the engine's start too):
- probes, in fallback: when `ProbeSchedule` says (spaced by their cost at the measured speeds); earlier when plain
  decoding measures slower than speculation last did; at once when the batch is smaller than any tried (where
  speculation gains more), or when, at another batch size than fallback began at, speculation measured faster
  there (a ragged end's small batches must not hold back the next full batch). A probe drafts as deep as
  speculation last went;
- arrival trials, for a batch made mostly of new requests (acceptance differs widely between requests, and a fixed
  K takes the easy ones for free): while speculating, unless speculation measured slower at about its size (then it
  neither gets one nor drafts over its prompts); in fallback only for a request alone in its batch, which times
  `alone_trial_steps` (a few steps' acceptance says little of a request's next tokens, and one that falls back
  stays so for its life), and only while what such trials gained, each with its stretch of speculation, is
  positive on balance (`VALUE_TRIALS`; else the spaced probes keep speculation's figure measured);
- a trial whose batch moves to a size where speculation measured slower ends there, in fallback (a ragged end's
  trial must not run on into the next full batch); a long trial whose first `probe_steps` steps lose by more than
  `CLEAR_LOSS` ends as a probe's would.
While speculating, explorations force `explore_steps` plain steps and time plain decoding afresh: every
`explore_every` steps, and soon after a trial begun in fallback or the engine's opening trial (whose plain figure is
of the engine's first, slow steps; a plain figure from a slow spell must not keep a losing speculation going; until
they are timed, no other batch size's figures decide); plain steps are also forced at a batch size whose plain speed
is unmeasured. At batch 1, depth explorations (`explore`) run the depth beside the chosen one.

KV lookahead follows each request's own K: `reservation` says how many drafts a request may get at its next choice
(at most twice its last K, so that K can grow step by step; none in fallback until a probe, which starts where
speculation last stood), the scheduler reserves draft-head slots for that many only, the head drafts as deep as
the deepest reservation, and `choose` stays within them. A new request that would be half its batch or more
reserves drafts when an arrival trial may come, so that the head drafts over its prompt (else its KV would miss it).
"""
from __future__ import annotations

import copy

import numpy as np

from peagle_vllm.depth.acceptance import Acceptance
from peagle_vllm.depth.cost import CostModel
from peagle_vllm.depth.explore import DepthExploration
from peagle_vllm.depth.optimiser import Weighing, drafts_per_request
from peagle_vllm.depth.options import DepthOptions
from peagle_vllm.depth.probes import ProbeSchedule, trial_cost
from peagle_vllm.depth.speeds import MeasuredSpeeds, SpeedsByKind, bucket
from peagle_vllm.depth.step import Step

# a long trial (`alone_trial_steps`) whose first `probe_steps` steps measure speculation slower than plain decoding
# by more than this share ends there: a request that slow rarely turns, and each long trial would cost its steps
CLEAR_LOSS = 1 / 3
VALUE_DECAY = 0.9  # weight of the past in what arrival trials gained, per trial: rare large gains must weigh in
VALUE_TRIALS = 4  # arrival trials measured before their value may stop them


class DepthController:
    """Per-request K from online acceptance estimates and a fitted step-cost model, overruled by measured speeds,
    which trials, probes and explorations keep current."""

    def __init__(self, options: DepthOptions) -> None:
        self.opt = options
        k = options.max_k
        self.acceptance = Acceptance(k, options.decay, options.prior_weight, options.batch_prior_weight)
        # step costs of greedy batches and of batches with a sampled request: verifying sampled drafts costs more
        # than greedy ones, and one fit over both puts that difference into the draft's fixed cost (`costs_for`)
        self.costs: dict[bool, CostModel] = {False: CostModel()}
        self.speeds_by_kind = SpeedsByKind()  # of steady plain and steady speculative steps, by batch size (`speeds`)
        self.sampled = False  # some request of the latest choice's batch samples: whose speeds decide
        self._weighing = Weighing()
        # draft rows per request of a step whose deepest choice is d drafts (`_lookahead`; none at d = 0)
        self._lookahead_rows = [0] + [self._lookahead(d) for d in range(1, k + 1)]
        self.typical_k = k  # largest K of the latest choice: what a new request may start from
        self.spec_k = k  # largest K of the latest speculative choice: where a probe starts
        self.steps = 0  # choices made: the clock of probes and exploration
        self.speculating = True  # whether the latest choice found drafting worth its cost
        self.probes = ProbeSchedule(options.probe_every)  # in fallback: when speculation is tried next
        self.trial_left = options.probe_steps  # steady speculative steps the current trial still has to time
        self.trial_length = options.probe_steps  # the steps it times in all
        self.probe_until = 4 * options.probe_steps  # the current trial's last step at the latest
        self.plain_left = 0  # exploration's forced plain steps still to come
        self.next_explore = self.probe_until + options.probe_every  # the next exploration's step while speculating
        self.plain_forced = False  # the latest choice forced a plain step: reserve nothing, so no draft runs
        self.depth_exploration = DepthExploration(options.depth_explore_every, options.explore_steps, k)
        self.summarized = 0  # `steps` at the latest summary
        self._last = (False, False)  # the latest step was the first draft after plain steps; it ran a draft
        self._expected = 1.0  # tokens per request the latest choice's drafts are expected to emit
        self.tried: set[int] = set()  # batch-size buckets where a trial of speculation has run
        self.fallback_bucket = 0  # batch-size bucket at which the latest fallback began
        self.trial_step = 0  # step at which the latest trial began
        self.trial_bucket = 0  # batch-size bucket at which it began (the engine's start: its first batch's)
        # at batch 1: seconds a trial gained, its stretch included (decayed mean), and trials measured
        self.trial_value: tuple[float, int] = (0.0, 0)
        self._stretch: float | None = None  # seconds gained so far by the latest trial at batch 1
        self._held: tuple[str, ...] = ()  # the batch of the latest choice, when it held the batch in fallback
        self._quiet_at = -1  # step of the latest choice that held its batch in fallback with nothing due

    def observe(self, req_ids: list[str], num_drafts: list[int], num_accepted: list[int]) -> None:
        """A step's verification results (`Acceptance.observe`)."""
        self.acceptance.observe(req_ids, num_drafts, num_accepted)

    def forget(self, req_id: str) -> None:
        self.acceptance.forget(req_id)

    def observe_step(self, step: Step) -> None:
        """One engine step: it fits the cost model, and steady plain and steady speculative steps are timed (see the
        module's doc). Steps with a prompt in them are left out of both: a prefill would make plain decoding look
        slow, and its many tokens, each cheaper than a decode step's, would set the per-token cost of verification."""
        opened, drafted = self._last
        opens = bool(step.draft_rows and not step.verified and not drafted)  # the first draft after plain steps
        self._last = (opens, bool(step.draft_rows))
        if step.seconds <= 0 or not step.emitted or not step.decode_only:
            return
        self.costs_for(step.sampled).observe(step.requests, step.tokens, step.draft_rows, step.seconds)
        plain, spec = self.speeds_by_kind[step.sampled].at(step.requests)
        gains_tracked = self._stretch is not None or self.probes.stretch is not None  # a trial's, a probe's
        if step.draft_rows and plain.value is not None and gains_tracked:
            # seconds plain decoding would take for the step's tokens, less the step's own
            gained = step.emitted / (step.requests * plain.value) - step.seconds
            if self._stretch is not None:
                self._stretch += gained
            self.probes.credit(gained, step.seconds)
        if step.draft_rows and not opens and not opened:
            spec.add(self._expected * step.requests, step.requests, step.seconds)
            self.trial_left = max(self.trial_left - 1, 0)
        elif not step.draft_rows and not step.verified and not drafted:
            plain.add(step.emitted, step.requests, step.seconds)

    def costs_for(self, sampled: bool) -> CostModel:
        """The cost model of greedy batches, or of batches with a sampled request: the first steps of a kind are
        priced as the other kind's fit says until their own fit takes over (a copy of it, refitted by their own)."""
        cost = self.costs.get(sampled)
        if cost is None:
            cost = self.costs[sampled] = copy.deepcopy(self.costs[not sampled])
        return cost

    @property
    def speeds(self) -> MeasuredSpeeds:
        """Measured speeds of the latest choice's kind of batch (`SpeedsByKind`; a new kind: the model's at first)."""
        return self.speeds_by_kind[self.sampled]

    def speculation_measured_faster(self, batch: int) -> bool | None:
        """`MeasuredSpeeds.speculation_faster` at about this batch size, ties going to the current regime."""
        return self.speeds.speculation_faster(batch, self.speculating)

    def _in_trial(self, step: int) -> bool:
        """Whether the current trial still times speculation at `step`."""
        return self.trial_left > 0 and step <= self.probe_until

    def _arrival_trial_due(self, step: int, batch: int) -> bool:
        """Whether a batch made mostly of new requests gets a trial at `step`, never within `probe_every` steps of
        the latest trial. While speculating, unless speculation measured slower at about its size; in fallback, only
        a request alone in its batch, while such trials gained on balance (or `VALUE_TRIALS` were not measured
        yet): beyond batch 1 a trial in fallback costs more than its timed steps (its requests fall out of step
        with the rest, the batch ends ragged), and the spaced probes keep speculation's figure there."""
        if step < self.trial_step + self.opt.probe_every:
            return False
        if self.speculating:
            return self.speculation_measured_faster(batch) is not False
        value, trials = self.trial_value
        return batch == 1 and (value >= 0.0 if trials >= VALUE_TRIALS else True)

    def _trial_left_behind(self, batch: int) -> bool:
        """The batch has moved, during a trial, to another bucket where speculation measured slower (a ragged end's
        trial as the next full batch arrives): the trial times nothing at its own size any more, and loses there."""
        return bucket(batch) != self.trial_bucket and self.speculation_measured_faster(batch) is False

    def _long_trial_lost(self, batch: int) -> bool:
        """A trial longer than `probe_steps` has timed that many, and speculation measures slower than plain decoding
        by more than `CLEAR_LOSS`: it ends as a probe's trial would."""
        if self.trial_length - self.trial_left < self.opt.probe_steps:  # (a probe's trial is over by then)
            return False
        rates = self.speeds.rates(batch)
        return rates is not None and rates[1] < (1 - CLEAR_LOSS) * rates[0]

    def _leave_trial(self, key: int) -> None:
        """Ends the current trial unfinished, straight into fallback at bucket `key`; the next probe one interval on
        (a probe's stretch is counted at the probe's own bucket)."""
        self.trial_left, self.speculating, self.fallback_bucket = 0, False, key
        self.probes.schedule(self.steps)
        self._close_stretch()
        self.probes.close_stretch()

    def _close_stretch(self) -> None:
        """The latest trial's stretch of speculation is over: what it gained joins the trial value."""
        if self._stretch is not None:
            value, trials = self.trial_value
            value = self._stretch if trials == 0 else value
            self.trial_value = (VALUE_DECAY * value + (1 - VALUE_DECAY) * self._stretch, trials + 1)
            self._stretch = None

    def reservation(self, req_id: str, batch: int | None = None) -> int:
        """Most drafts this request may be given at its next choice (and lookahead to reserve for). `batch`: the
        size of the batch it is about to join, for a new request (the engine's running and waiting requests, up to
        its limit; by default the requests seen so far and this one)."""
        requests = self.acceptance.requests
        s = requests.get(req_id)
        last = self.typical_k if s is None or s.last_k is None else s.last_k
        plain_next = last == 0 and self._fallback_next()
        if s is None:
            size = len(requests) + 1 if batch is None else max(batch, 1)
            if plain_next and 2 * (size - len(requests)) >= size and self._arrival_trial_due(self.steps + 1, size):
                plain_next = False  # new requests, half the batch or more: their trial may start with their prompts
            elif self.speculating and (self._trial_left_behind(size) if self._in_trial(self.steps + 1)
                                       else self.speculation_measured_faster(size) is False):
                # the next choice falls back (no arrival trial where speculation measured slower, a trial at another
                # size is left): drafting over the prompt would be for nothing
                plain_next = True
        if self.plain_forced or plain_next:
            return self.opt.min_k  # exploring, or in fallback with no probe due: plain decoding next step
        if last == 0:  # a request back from K=0 starts where speculation stood
            return int(min(self.opt.max_k, max(self.spec_k, self.opt.probe_k, self.opt.min_k)))
        return self._lookahead(last)

    def _fallback_next(self) -> bool:
        """In fallback, with no probe due at the next step."""
        return not self.speculating and not self.probes.due(self.steps + 1)

    def plain_next(self) -> bool:
        """Whether every request at K=0 now is reserved nothing for the next step, as `reservation` says for each
        (exploring, or in fallback with no probe due, and `min_k` 0): the engine need not ask per request then."""
        return self.opt.min_k == 0 and (self.plain_forced or self._fallback_next())

    def _lookahead(self, k: int) -> int:
        """Drafts reserved for a request whose K is now k (> 0): up to twice as many, so that K can grow step by
        step; the head drafts that deep in the next step, whatever K is then chosen."""
        return min(self.opt.max_k, max(2 * k, self.opt.probe_k, self.opt.min_k))

    def choose(self, req_ids: list[str], caps: list[int] | None = None, sampled: bool = False) -> list[int]:
        """K for each request of this step's batch; `caps` (e.g. the drafts whose KV slots were reserved) bound each
        request's K from above; `sampled`: some request of the batch samples (its steps' own cost model)."""
        if not req_ids:
            return []
        self.steps += 1
        self.sampled = sampled
        if self._quiet_fallback(req_ids):
            self._quiet_at = self.steps
            return self._stay_in_fallback(req_ids)
        kmax, batch = self.opt.max_k, len(req_ids)
        key = bucket(batch)
        if self.steps == 1:
            self.trial_bucket = key
        smaller = self._smaller_than_tried(key)
        arrival = self._arrival_trial(req_ids)
        # a batch size other than the one fallback began at, where speculation measured faster: probed now
        moved = not self.speculating and key != self.fallback_bucket and self.speculation_measured_faster(batch)
        probe = not self.speculating and (self.probes.due(self.steps) or smaller or moved)
        trial = probe or arrival
        if trial:  # speculation runs at the optimiser's K until its speed is timed afresh
            self._start_trial(key, batch, probe)
        in_trial = self._in_trial(self.steps)
        if in_trial and not trial and self._trial_left_behind(batch):
            self._leave_trial(key)
            in_trial = False
        elif in_trial and self._long_trial_lost(batch):
            self.trial_left, in_trial = 0, False  # decided as a probe's trial is (below)
        if in_trial:
            self.tried.add(key)
        # measured speeds overrule the model both ways, outside trials and explorations (timed afresh: a neighbour's
        # figures would stand in); a trial's tie speculates; beyond batch 1 see the module's doc for a tie's drafts
        faster = True if in_trial or self.plain_left else self.speculation_measured_faster(batch)
        tied = batch > 1 and self.speculating and not (in_trial or self.plain_left) and self.speeds.verdict(batch) == 0
        if faster and not self.speculating and not in_trial:
            # in fallback only a trial resumes speculation (see the module's doc): the trial comes early instead
            self.probes.bring_forward(self.steps)
            faster = False
        if faster is False and not self.speculating and not self.opt.min_k:
            return self._stay_in_fallback(req_ids)
        curves = self.acceptance.curves(req_ids)
        threshold, depth = self._weighing.weigh(curves, self.costs_for(sampled), self._lookahead_rows, self.steps,
                                                speculate=bool(faster), may_keep=bool(faster) and not in_trial)
        if faster is False or tied and 4 * sum(curves.reaching(r, threshold, depth) > 0 for r in range(batch)) <= batch:
            threshold = np.inf
        if self.speculating and threshold == np.inf:
            self._enter_fallback(key, batch)
        self.speculating = threshold < np.inf
        self.plain_left, self.plain_forced = max(self.plain_left - 1, 0), False
        if self.speculating:  # plain steps keep plain decoding's speed measured (see the module's doc)
            if not in_trial and self.steps >= self.next_explore:
                self.plain_left, self.next_explore = self.opt.explore_steps, self.steps + self.opt.explore_every
                self.speeds.time_plain_afresh(key)  # as a trial times speculation afresh
            if self.plain_left or self.speeds.plain_unmeasured(batch):
                threshold, self.plain_forced = np.inf, True
        if self.speculating and not self.plain_forced and batch == 1 and not in_trial:
            threshold, depth = self.depth_exploration.choose(self.steps, threshold, depth, self.costs_for(sampled))
        short = min(self.opt.probe_k, kmax) if trial and not self.plain_forced else 0  # where the model says no
        caps = [kmax] * batch if caps is None else caps
        out, self._expected = drafts_per_request(curves, threshold, depth, short, self.opt.min_k, caps)
        requests, stats, self._held = self.acceptance.requests, self.acceptance.stats, ()
        for rid, k in zip(req_ids, out):
            (requests.get(rid) or stats(rid)).last_k = k
        self.typical_k = max(out)
        if self.speculating and self.typical_k:
            self.spec_k = self.typical_k
        return out

    def _start_trial(self, key: int, batch: int, probe: bool) -> None:
        """A trial (a probe, or an arrival trial) begins at this step, in bucket `key`."""
        timed = self.opt.probe_steps if probe or batch > 1 else self.opt.alone_trial_steps
        self.trial_left, self.trial_length, self.probe_until = timed, timed, self.steps + 4 * timed
        self.trial_step, self.trial_bucket = self.steps, key
        if probe and key > 1:
            self.probes.open_stretch(key)
        self._close_stretch()
        if batch == 1:  # what the trial gains, its stretch of speculation included, is measured
            self._stretch = 0.0
        if not self.speculating:
            self.probes.schedule(self.steps)  # (again when the trial ends in fallback)
            self.next_explore = self.probe_until + self.opt.probe_every  # a trial won is checked soon
        self.speeds.time_speculation_afresh(key)

    def _enter_fallback(self, key: int, batch: int) -> None:
        """Speculation ends at this step, in bucket `key`: the first probe comes one interval later."""
        self.fallback_bucket = key
        lost = trial_cost(self.speeds.measured(batch), self.opt.probe_steps)  # plain steps a trial loses here
        self.probes.enter_fallback(self.steps, key, batch, lost)
        self._close_stretch()

    def _quiet_fallback(self, req_ids: list[str]) -> bool:
        """In fallback with nothing due at this step, so that the rest of `choose` would only keep it there: no probe
        or trial due (none scheduled, no batch smaller than any tried, no arrival trial), speculation measured slower
        at about this batch size (neither a tie, nor faster, which would bring the next probe forward, nor
        unmeasured), and `min_k` 0. Most steps at larger batches are such steps: checked first, they skip the rest (a
        step in fallback is the shortest there is)."""
        if self.speculating or self.opt.min_k or self.probes.due(self.steps):
            return False
        batch = len(req_ids)
        if self._smaller_than_tried(bucket(batch)) or self.speculation_measured_faster(batch) is not False:
            return False
        return not self._arrival_trial(req_ids)

    def chose_quiet_fallback(self) -> bool:
        """Whether the latest choice held its batch in fallback with nothing due (`_quiet_fallback`), so that the
        steps after it may hold the batch without a choice (`FallbackHold`). A probe's step never does: its requests
        reserve drafts, so a draft runs in it."""
        return self._quiet_at == self.steps

    def hold_step(self) -> None:
        """A step of a held batch (`FallbackHold`): the clock advances, nothing else changes."""
        self.steps += 1

    def _smaller_than_tried(self, key: int) -> bool:
        """The batch's bucket is smaller than any where speculation was tried (it gains most at small batches)."""
        return key < min(self.tried, default=key + 1)

    def _arrival_trial(self, req_ids: list[str]) -> bool:
        """A batch made mostly of new requests gets an arrival trial at this step (see `_arrival_trial_due`)."""
        requests = self.acceptance.requests
        return self._arrival_trial_due(self.steps, len(req_ids)) and \
            2 * sum(rid not in requests for rid in req_ids) >= len(req_ids)

    def _stay_in_fallback(self, req_ids: list[str]) -> list[int]:
        """`choose` for a batch in fallback with nothing due and `min_k` 0: K=0 for all, nothing to weigh."""
        self.plain_left, self.plain_forced = 0, False
        batch = tuple(req_ids)
        if batch != self._held:  # else the batch held at the step before: its requests are at K=0 already
            requests, stats = self.acceptance.requests, self.acceptance.stats
            for rid in req_ids:
                (requests.get(rid) or stats(rid)).last_k = 0
            self._held = batch
        self.typical_k, self._expected = 0, 1.0
        return [0] * len(req_ids)

    def summary(self) -> str:
        """One log line on the controller's state if it chose since the last call: speculating or in fallback, the
        fitted step costs, and the measured speeds that decide (the chosen K are counted by `peagle:chosen_k`)."""
        if self.steps == self.summarized:
            return ""
        self.summarized = self.steps
        fits = "; ".join(f"{'sampled' if sampled else 'greedy'} batches: {cost.describe()}"
                         for sampled, cost in sorted(self.costs.items()))
        return (f"{'speculating' if self.speculating else 'fallback'}, probe interval {self.probes.interval} steps; "
                f"fitted step cost, {fits}; measured tokens per request-second, plain/speculative, by "
                f"batch size: {self.speeds_by_kind.describe() or 'none yet'}")
