"""Engine-core hooks on `vllm.v1.core.sched.scheduler.Scheduler` for adaptive depth (their state:
`scheduler_state.SchedulerState`).

- `__init__`: a p_eagle scheduler gets its state, with a DepthController unless the config fixes K.
- `update_draft_token_ids`: with prompt or corpus lookup on, requests' drafts come from their own text or
  from the corpus where those say what comes next, and from the head elsewhere (`prompt_lookup`; past `head_depth`,
  from lookups only; the positions the lookups gave ride to the worker with the step that verifies them, whose
  sampler takes their q as one-hot: `scheduled_q`); then each request's drafts are cut to the K the controller
  chooses (never more than the lookahead reserved for it), so the next step verifies only those (K=0: plain
  decoding for that request); then blocks the request no longer needs go back to the pool
  (`rollback_hook.release_surplus`). Seeded requests keep K_max so that the same seed gives the
  same output.
- `schedule`: first, a request about to draft after steps that ran no draft has the tokens of those
  steps computed again, so that the head's KV has them (`head_catch_up`). After it, the block counts
  of released requests, and the most drafts any scheduled request may get next, ride to the worker
  on the SchedulerOutput (the proposer drafts only that deep; at 0, a batch in fallback, no draft
  runs and the step costs what plain decoding costs).
- The KV manager's allocate_slots reserves each request's draft-head lookahead for its own K (in steady
  fallback, where no request may draft and no waiting one can join, vLLM's own runs, without lookahead).
- `update_from_output`: accepted counts per request and the step's time, token count and draft rows
  feed the controller; finished requests are forgotten; every 10 s a `p_eagle depth:` line logs the
  controller's regime, its probe interval, the fitted step costs, the blocks released early and the
  tokens computed again for the head.
  After a depth-0 step no draft token ids come (none were drafted; post_step below does not ask):
  the controller's choice for that step (K=0 for all) is made here instead. In steady fallback the next
  steps of the same batch only keep their time for the controller (`depth.FallbackHold`), which gets them
  at the next step that is not one (or before a schedule that may draft) and chooses again.
- `make_stats`: the K chosen per request (under async scheduling, where drafts bypass
  `update_draft_token_ids`, the K each request verifies, counted in `update_from_output`), steps without a
  draft and the draft times measured in the worker ride to the front end in vLLM's per-step SchedulerStats
  (`metrics_hook` takes them out again before vLLM's loggers read it), for any p_eagle scheduler, fixed K
  included: those of the last CARRY_EVERY_S at a time, and all of them when the engine holds no more requests.
- `EngineCore.post_step`: after a step that ran no draft (depth 0) the worker holds no draft token ids,
  so they are not asked for: under multiprocessing (a server) that is a round trip to the worker
  process per step, which a no-spec engine does not make.
Synchronous scheduling only (vLLM's CPU backend forces it); under async scheduling drafts reach the
runner directly, so K stays fixed (warned at startup) and every request reserves K_max lookahead.
"""

from __future__ import annotations

import functools
import time

from peagle_vllm.depth import DepthController, FallbackHold, Step
from peagle_vllm.metrics import EngineFigures
from peagle_vllm.vllm_adapter.log import logger
from peagle_vllm.vllm_adapter.v1 import carriers, rollback_hook
from peagle_vllm.vllm_adapter.v1.carriers import is_marked, mark_of
from peagle_vllm.vllm_adapter.v1.prompt_lookup import with_lookup
from peagle_vllm.vllm_adapter.v1.scheduler_state import STATE_ATTR, SchedulerState, state_of

LOG_EVERY_S = 10.0  # like vLLM's own periodic stats line
# our engine figures ride to the front end this often, and when the engine empties (a run's figures are then
# complete): every step, taking them out and counting them cost 0.1 ms a step, 1% of a plain step at c=4 here
CARRY_EVERY_S = 0.25
DEPTH_ATTR = carriers.DRAFT_DEPTH_ATTR  # also kept on the Scheduler itself, for EngineCore.post_step


def wrap_init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is None or not is_marked(spec):
            return
        mark = mark_of(spec)
        adaptive = mark.options.adaptive and not self.scheduler_config.async_scheduling
        if mark.options.looks_up and self.scheduler_config.async_scheduling:
            logger.warning("p_eagle: prompt and corpus lookup need synchronous scheduling (drafts pass through the "
                           "scheduler); with async scheduling the head drafts alone. Pass --no-async-scheduling "
                           "for lookup.")
        if mark.options.adaptive and not adaptive:
            logger.warning("p_eagle: adaptive depth needs synchronous scheduling (drafts pass through the "
                           "scheduler); with async scheduling K stays fixed at %d. Pass "
                           "--no-async-scheduling for adaptive depth.", mark.options.num_speculative_tokens)
        state = SchedulerState(self, mark, adaptive, async_scheduling=bool(self.scheduler_config.async_scheduling))
        setattr(self, STATE_ATTR, state)
        if adaptive:
            rollback_hook.reserve_own_lookahead(self, lambda request: state.lookahead(self, request))

    return __init__


def wrap_schedule(original):
    @functools.wraps(original)
    def schedule(self, *args, **kwargs):
        state = state_of(self)
        ctrl = state.ctrl if state is not None else None
        if ctrl is None:
            out = original(self, *args, **kwargs)
            if state is not None and state.lookup is not None:
                carriers.set_lookup_positions(out, state.take_lookup_positions(out))
            return out
        # with plain_next, requests with a gap (at K=0 since) draft only when seeded
        state.plain_next = plain = ctrl.plain_next()
        seeded = any(state.seeded_ids.values())
        if not plain or seeded:
            _release_held(state)  # (their tokens are gaps of the head)
            state.gaps.rewind(self, lambda rid: state.is_seeded(self, rid)
                              or not plain and ctrl.reservation(rid) > 0)
        reserved = state.reserved
        if plain and not seeded and _none_can_join(self) and all(reserved.get(r.request_id) == 0 for r in self.running):
            out = rollback_hook.schedule_without_lookahead(self, original, args, kwargs)
            depth = 0 if out.num_scheduled_tokens else ctrl.opt.max_k  # only running requests, reserved nothing
        else:
            out = original(self, *args, **kwargs)
            depth = max((reserved.get(rid, ctrl.opt.max_k) for rid in out.num_scheduled_tokens),
                        default=ctrl.opt.max_k)
        if state.block_counts:
            carriers.set_block_counts(out, state.block_counts)
            state.block_counts = {}
        if state.lookup is not None:
            carriers.set_lookup_positions(out, state.take_lookup_positions(out))
        carriers.set_draft_depth(out, depth)
        setattr(self, DEPTH_ATTR, depth)  # for post_step
        return out

    return schedule


def _none_can_join(self) -> bool:
    """No waiting request can join the batch at this schedule: none waits, or the batch is full (vLLM admits one
    only below its limit of active requests). A saturated engine always has requests waiting: at concurrency 16
    in the benchmark, half its steps in fallback took the per-request lookahead path for that alone."""
    if not self.get_request_counts()[1]:
        return True
    limit = getattr(self, "max_num_active_reqs", self.max_num_running_reqs)
    return len(self.running) + getattr(self, "num_waiting_for_streaming_input", 0) >= limit


def wrap_update_draft_token_ids(original):
    @functools.wraps(original)
    def update_draft_token_ids(self, draft_token_ids):
        state = state_of(self)
        if state is None:
            return original(self, draft_token_ids)
        ctrl = state.ctrl
        req_ids = list(draft_token_ids.req_ids)
        by_lookup = None
        if state.head_depth is not None:
            draft_token_ids.draft_token_ids = [list(d)[:state.head_depth] for d in draft_token_ids.draft_token_ids]
        if state.lookup is not None and req_ids:
            draft_token_ids.draft_token_ids, by_lookup = with_lookup(self, state.lookup, state.history, req_ids,
                                                                     draft_token_ids.draft_token_ids, state.max_k)
        if ctrl is not None and req_ids:
            ks = ctrl.choose(req_ids, [state.reserved.get(rid, ctrl.opt.max_k) for rid in req_ids],
                             sampled=state.is_sampled(self, req_ids))
            draft_token_ids.draft_token_ids = [list(d) if state.is_seeded(self, rid) else list(d)[:k]
                                               for rid, d, k in zip(req_ids, draft_token_ids.draft_token_ids, ks)]
        if req_ids:
            state.figures.add_choices([len(d) for d in draft_token_ids.draft_token_ids])
        if by_lookup:
            state.note_lookup_drafts(req_ids, by_lookup, draft_token_ids.draft_token_ids)
        out = original(self, draft_token_ids)
        if ctrl is not None:
            state.release_surplus(self, req_ids)
        return out

    return update_draft_token_ids


def _choose_without_drafts(scheduler, state: SchedulerState, req_ids: list[str]) -> None:
    """The choice for a step after which no request drafted (depth 0): K=0 for every request, made by the
    controller all the same (its clock, probes and fallback bookkeeping run on every step); in steady fallback
    it holds the batch for the next few steps (`FallbackHold`)."""
    sampled = state.is_sampled(scheduler, req_ids)
    ks = state.ctrl.choose(req_ids, [0] * len(req_ids), sampled=sampled)
    state.hold.start(state.ctrl, req_ids, sampled)
    state.figures.add_choices(ks)


def _hold(state: SchedulerState, scheduler_output, model_runner_output) -> bool:
    """Whether this step (no draft ran) is one more of a batch held in fallback (`FallbackHold`): then it is kept
    for the controller and its K=0 counted, and nothing else is done for it."""
    hold: FallbackHold = state.hold
    last = state.last_step
    scheduled = scheduler_output.num_scheduled_tokens
    if (last is None or scheduler_output.finished_req_ids
            or not hold.holds(scheduled.keys(), scheduler_output.total_num_scheduled_tokens)):
        return False
    state.last_step = now = time.perf_counter()
    hold.keep(state.ctrl, now - last, sum(map(len, model_runner_output.sampled_token_ids)))
    state.figures.add_fallback(len(hold.batch))
    return True


def _release_held(state: SchedulerState) -> None:
    """The held steps to the controller, and their tokens to the head's gaps."""
    n = state.hold.release(state.ctrl)
    if n:
        state.gaps.note_held(state.hold.batch, n)


def _step(scheduler_output, model_runner_output, seconds: float, max_k: int, sampled: bool) -> Step:
    """The controller's view of one finished engine step (`sampled`: some request of it samples)."""
    requests = len(scheduler_output.num_scheduled_tokens)
    depth = carriers.draft_depth(scheduler_output)
    return Step(tokens=scheduler_output.total_num_scheduled_tokens,
                draft_rows=(max_k if depth is None else depth) * requests, seconds=seconds,
                requests=requests, emitted=sum(map(len, model_runner_output.sampled_token_ids)),
                verified=sum(map(len, scheduler_output.scheduled_spec_decode_tokens.values())), sampled=sampled)


def wrap_update_from_output(original):
    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output):
        state = state_of(self)
        if state is None:
            return original(self, scheduler_output, model_runner_output)
        figures: EngineFigures = state.figures
        if state.lookup is not None:
            for req_id in scheduler_output.finished_req_ids:
                state.history.forget(req_id)
                state.lookup_given.pop(req_id, None)
        drafted = carriers.draft_depth(scheduler_output) != 0  # depth 0: no draft ran
        if drafted:
            figures.add_draft(*carriers.draft_time(model_runner_output))
        elif scheduler_output.total_num_scheduled_tokens:
            figures.steps_without_draft += 1
        if state.counts_verified_drafts and scheduler_output.scheduled_spec_decode_tokens:
            figures.add_choices([len(d) for d in scheduler_output.scheduled_spec_decode_tokens.values()])
        ctrl = state.ctrl
        if ctrl is not None and (drafted or not _hold(state, scheduler_output, model_runner_output)):
            _release_held(state)
            _observe(self, state, scheduler_output, model_runner_output, drafted)
            if not drafted:
                _choose_without_drafts(self, state, list(scheduler_output.num_scheduled_tokens))
        out = original(self, scheduler_output, model_runner_output)
        if ctrl is not None and not drafted and scheduler_output.scheduled_spec_decode_tokens:
            # every reservation was 0: only rejected drafts can have left blocks behind
            state.release_surplus(self, list(scheduler_output.scheduled_spec_decode_tokens))
        if ctrl is not None and not self.requests:
            state.last_step = None  # idle time between requests is no step cost
        return out

    return update_from_output


def _observe(self, state: SchedulerState, scheduler_output, model_runner_output, drafted: bool) -> None:
    """The finished step for the controller: its time, tokens and draft rows, each request's accepted drafts;
    then the head's gaps and finished requests; and the periodic `p_eagle depth:` log line."""
    ctrl: DepthController = state.ctrl
    now = time.perf_counter()
    if state.last_step is not None and scheduler_output.total_num_scheduled_tokens:
        ctrl.observe_step(_step(scheduler_output, model_runner_output, now - state.last_step, ctrl.opt.max_k,
                                state.is_sampled(self, scheduler_output.num_scheduled_tokens)))
    state.last_step = now
    if now - state.last_log >= LOG_EVERY_S:
        state.last_log = now
        line = ctrl.summary()
        if line:
            logger.info("p_eagle depth: %s; KV blocks released early: %d; head catch-up tokens: %d", line,
                        state.blocks_released, state.gaps.caught_up)
    if scheduler_output.scheduled_spec_decode_tokens:
        index = model_runner_output.req_id_to_index
        sampled = model_runner_output.sampled_token_ids
        verified = [(req_id, len(drafts), max(len(sampled[i]) - 1, 0))  # (request, drafts, accepted)
                    for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items()
                    if (i := index.get(req_id)) is not None and i < len(sampled)]
        if verified:
            ctrl.observe(*(list(column) for column in zip(*verified)))
    state.gaps.note_step(scheduler_output.num_scheduled_tokens, drafted=drafted)
    for req_id in scheduler_output.finished_req_ids:
        state.forget(req_id)


def wrap_make_stats(original):
    @functools.wraps(original)
    def make_stats(self, *args, **kwargs):
        stats = original(self, *args, **kwargs)
        state = state_of(self)
        if state is None or stats is None:
            return stats
        now = time.perf_counter()
        carrier = carriers.stats_carrier(stats)
        if carrier is not None and (now - state.carried >= CARRY_EVERY_S or not self.requests):
            carrier.update(state.figures.drain())
            state.carried = now
        return stats

    return make_stats


def wrap_post_step(original):
    @functools.wraps(original)
    def post_step(self, model_executed: bool) -> None:
        if getattr(self.scheduler, DEPTH_ATTR, None) == 0:
            return  # no draft ran: the worker has no draft token ids to give (see the module's doc)
        return original(self, model_executed)

    return post_step
