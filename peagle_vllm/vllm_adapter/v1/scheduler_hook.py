"""Engine-core hooks on `vllm.v1.core.sched.scheduler.Scheduler` for adaptive depth.

- `__init__`: a p_eagle scheduler gets a DepthController (unless the config fixes K).
- `update_draft_token_ids`: each request's drafts are cut to the K the controller chooses (never
  more than the lookahead reserved for it), so the next step verifies only those (K=0: plain
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
- `make_stats`: the K chosen per request, steps without a draft and the draft times measured in the
  worker ride to the front end in vLLM's per-step SchedulerStats (`metrics_hook` takes them out
  again before vLLM's loggers read it), for any p_eagle scheduler, fixed K included: those of the last
  CARRY_EVERY_S at a time, and all of them when the engine holds no more requests.
- `EngineCore.post_step`: after a step that ran no draft (depth 0) the worker holds no draft token ids,
  so they are not asked for: under multiprocessing (a server) that is a round trip to the worker
  process per step, which a no-spec engine does not make.
Synchronous scheduling only (vLLM's CPU backend forces it); under async scheduling drafts reach the
runner directly, so K stays fixed (warned at startup) and every request reserves K_max lookahead.
"""

from __future__ import annotations

import functools
import logging
import time

from peagle_vllm.depth import DepthController, DepthOptions, FallbackHold, Step
from peagle_vllm.metrics import EngineFigures
from peagle_vllm.vllm_adapter import LOGGER_NAME, rollback_hook
from peagle_vllm.vllm_adapter.config_hook import is_marked, mark_of
from peagle_vllm.vllm_adapter.head_catch_up import HeadGaps

logger = logging.getLogger(LOGGER_NAME)
ATTR = "_peagle_depth"
SAMPLING_EPS = 1e-5  # vLLM's greedy threshold on temperature
LOG_EVERY_S = 10.0  # like vLLM's own periodic stats line
# our engine figures ride to the front end this often, and when the engine empties (a run's figures are then
# complete): every step, taking them out and counting them cost 0.1 ms a step, 1% of a plain step at c=4 here
CARRY_EVERY_S = 0.25
DRAFT_DEPTH_ATTR = "peagle_draft_depth"  # SchedulerOutput attribute: drafts any scheduled request may get
DRAFT_TIME_ATTR = "peagle_draft_time"  # ModelRunnerOutput attribute: (draft runs, seconds) of the step
FIGURES_ATTR = "_peagle_figures"
# SchedulerStats' one dict[str, int] field: it carries our figures (under `peagle:` keys) to the front end
CARRIER_FIELD = "num_kv_fetch_reqs_by_stage"


def _wrap_init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is not None and is_marked(spec):
            opts = mark_of(spec)["options"]
            setattr(self, FIGURES_ATTR, EngineFigures())
            self._peagle_carried = 0.0  # when the figures last rode to the front end (see make_stats)
            if opts.get("adaptive", True) and self.scheduler_config.async_scheduling:
                logger.warning("p_eagle: adaptive depth needs synchronous scheduling (drafts pass through the "
                               "scheduler); with async scheduling K stays fixed at %d. Pass "
                               "--no-async-scheduling for adaptive depth.", opts["num_speculative_tokens"])
            elif opts.get("adaptive", True):
                ctrl = DepthController(DepthOptions(max_k=opts["num_speculative_tokens"], min_k=opts.get("min_k", 0)))
                setattr(self, ATTR, ctrl)
                self._peagle_last_step = None
                self._peagle_plain_next = False  # DepthController.plain_next as of this step's scheduling
                self._peagle_last_log = time.perf_counter()
                self._peagle_reserved: dict[str, int] = {}  # drafts whose lookahead is reserved
                self._peagle_seeded_ids: dict[str, bool] = {}  # see _is_seeded
                self._peagle_block_counts: dict[str, tuple[int, ...]] = {}  # released, for the worker
                self._peagle_gaps = HeadGaps()  # tokens the draft head has not seen (steps in fallback)
                self._peagle_hold = FallbackHold()  # steady fallback's steps that skip the controller
                self.peagle_blocks_released = 0  # blocks handed back before their request ended
                self._peagle_trimmable = rollback_hook.trimmable_managers(self)  # fixed for the engine's life
                rollback_hook.reserve_own_lookahead(self, self._peagle_lookahead)

    return __init__


def _lookahead(self, request) -> int:
    """Draft-head slots to reserve for this request: K_max when seeded, else what the controller
    may give it next (recorded, since its drafts are then capped at that). The batch it joins is
    what the engine holds, up to its limit (requests arriving together come as one batch)."""
    rid = request.request_id
    if self._peagle_plain_next and self._peagle_reserved.get(rid) == 0:
        return 0  # a request at K=0 stays there (see DepthController.plain_next)
    ctrl: DepthController = getattr(self, ATTR)
    batch = min(len(self.running) + len(self.waiting), self.max_num_running_reqs)
    k = ctrl.opt.max_k if self._peagle_seeded(rid) else ctrl.reservation(rid, batch)
    self._peagle_reserved[rid] = k
    return k


def _wrap_schedule(original):
    @functools.wraps(original)
    def schedule(self, *args, **kwargs):
        ctrl: DepthController | None = getattr(self, ATTR, None)
        if ctrl is None:
            return original(self, *args, **kwargs)
        # with plain_next, requests with a gap (at K=0 since) draft only when seeded
        self._peagle_plain_next = plain = ctrl.plain_next()
        seeded = any(self._peagle_seeded_ids.values())
        if not plain or seeded:
            _release_held(self, ctrl)  # (their tokens are gaps of the head)
            self._peagle_gaps.rewind(self, lambda rid: self._peagle_seeded(rid)
                                     or not plain and ctrl.reservation(rid) > 0)
        reserved = self._peagle_reserved
        if plain and not seeded and _none_can_join(self) and all(reserved.get(r.request_id) == 0 for r in self.running):
            out = rollback_hook.schedule_without_lookahead(self, original, args, kwargs)
            depth = 0 if out.num_scheduled_tokens else ctrl.opt.max_k  # only running requests, reserved nothing
        else:
            out = original(self, *args, **kwargs)
            depth = max((reserved.get(rid, ctrl.opt.max_k) for rid in out.num_scheduled_tokens),
                        default=ctrl.opt.max_k)
        if self._peagle_block_counts:
            setattr(out, rollback_hook.COUNTS_ATTR, self._peagle_block_counts)
            self._peagle_block_counts = {}
        setattr(out, DRAFT_DEPTH_ATTR, depth)
        setattr(self, DRAFT_DEPTH_ATTR, depth)  # for post_step
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


def _wrap_update_drafts(original):
    @functools.wraps(original)
    def update_draft_token_ids(self, draft_token_ids):
        ctrl: DepthController | None = getattr(self, ATTR, None)
        figures: EngineFigures | None = getattr(self, FIGURES_ATTR, None)
        req_ids = list(draft_token_ids.req_ids)
        if ctrl is not None and req_ids:
            ks = ctrl.choose(req_ids, [self._peagle_reserved.get(rid, ctrl.opt.max_k) for rid in req_ids])
            draft_token_ids.draft_token_ids = [list(d) if self._peagle_seeded(rid) else list(d)[:k]
                                               for rid, d, k in zip(req_ids, draft_token_ids.draft_token_ids, ks)]
        if figures is not None and req_ids:
            figures.add_choices([len(d) for d in draft_token_ids.draft_token_ids])
        out = original(self, draft_token_ids)
        if ctrl is not None:
            self._peagle_release_surplus(req_ids)
        return out

    return update_draft_token_ids


def _release_surplus(self, req_ids: list[str]) -> None:
    """Hands back the blocks each request's next step will not touch (after its K was chosen)."""
    ctrl: DepthController = getattr(self, ATTR)
    for rid in req_ids:
        request = self.requests.get(rid)
        if request is None or request.is_finished():
            continue
        lookahead = ctrl.opt.max_k if self._peagle_seeded(rid) else ctrl.reservation(rid)
        released = rollback_hook.release_surplus(self._peagle_trimmable, request, lookahead)
        if released is not None:
            self._peagle_block_counts[rid] = released[0]
            self.peagle_blocks_released += released[1]


def _choose_without_drafts(self, req_ids: list[str], figures: EngineFigures | None) -> None:
    """The choice for a step after which no request drafted (depth 0): K=0 for every request, made by the
    controller all the same (its clock, probes and fallback bookkeeping run on every step); in steady fallback
    it holds the batch for the next few steps (`FallbackHold`)."""
    ctrl: DepthController = getattr(self, ATTR)
    ks = ctrl.choose(req_ids, [0] * len(req_ids))
    self._peagle_hold.start(ctrl, req_ids)
    if figures is not None:
        figures.add_choices(ks)


def _hold(self, ctrl: DepthController, scheduler_output, model_runner_output, figures: EngineFigures | None) -> bool:
    """Whether this step (no draft ran) is one more of a batch held in fallback (`FallbackHold`): then it is kept
    for the controller and its K=0 counted, and nothing else is done for it."""
    hold: FallbackHold = self._peagle_hold
    last = self._peagle_last_step
    scheduled = scheduler_output.num_scheduled_tokens
    if (last is None or scheduler_output.finished_req_ids
            or not hold.holds(scheduled.keys(), scheduler_output.total_num_scheduled_tokens)):
        return False
    self._peagle_last_step = now = time.perf_counter()
    hold.keep(ctrl, now - last, sum(map(len, model_runner_output.sampled_token_ids)))
    if figures is not None:
        figures.add_fallback(len(hold.batch))
    return True


def _release_held(self, ctrl: DepthController) -> None:
    """The held steps to the controller, and their tokens to the head's gaps."""
    hold: FallbackHold = self._peagle_hold
    n = hold.release(ctrl)
    if n:
        self._peagle_gaps.note_held(hold.batch, n)


def _is_seeded(self, req_id: str) -> bool:
    """Sampled requests with a seed keep the full K: timing-driven depth would make their samples
    unrepeatable (greedy outputs do not depend on K, so a seed there changes nothing). Looked up
    several times per request per step: remembered until the request finishes."""
    seeded = self._peagle_seeded_ids.get(req_id)
    if seeded is None:
        request = self.requests.get(req_id)
        params = getattr(request, "sampling_params", None)
        seeded = params is not None and params.seed is not None and params.temperature > SAMPLING_EPS
        if request is not None:
            self._peagle_seeded_ids[req_id] = seeded
    return seeded


def _step(scheduler_output, model_runner_output, seconds: float, max_k: int) -> Step:
    """The controller's view of one finished engine step."""
    requests = len(scheduler_output.num_scheduled_tokens)
    return Step(tokens=scheduler_output.total_num_scheduled_tokens,
                draft_rows=getattr(scheduler_output, DRAFT_DEPTH_ATTR, max_k) * requests, seconds=seconds,
                requests=requests, emitted=sum(map(len, model_runner_output.sampled_token_ids)),
                verified=sum(map(len, scheduler_output.scheduled_spec_decode_tokens.values())))


def _wrap_update_from_output(original):
    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output):
        figures: EngineFigures | None = getattr(self, FIGURES_ATTR, None)
        drafted = getattr(scheduler_output, DRAFT_DEPTH_ATTR, None) != 0  # depth 0: no draft ran
        if figures is not None:
            if drafted:
                figures.add_draft(*getattr(model_runner_output, DRAFT_TIME_ATTR, (0, 0.0)))
            elif scheduler_output.total_num_scheduled_tokens:
                figures.steps_without_draft += 1
        ctrl: DepthController | None = getattr(self, ATTR, None)
        if ctrl is not None and (drafted or not _hold(self, ctrl, scheduler_output, model_runner_output, figures)):
            _release_held(self, ctrl)
            _observe(self, ctrl, scheduler_output, model_runner_output, drafted)
            if not drafted:
                _choose_without_drafts(self, list(scheduler_output.num_scheduled_tokens), figures)
        out = original(self, scheduler_output, model_runner_output)
        if ctrl is not None and not drafted and scheduler_output.scheduled_spec_decode_tokens:
            # every reservation was 0: only rejected drafts can have left blocks behind
            self._peagle_release_surplus(list(scheduler_output.scheduled_spec_decode_tokens))
        if ctrl is not None and not self.requests:
            self._peagle_last_step = None  # idle time between requests is no step cost
        return out

    return update_from_output


def _observe(self, ctrl: DepthController, scheduler_output, model_runner_output, drafted: bool) -> None:
    """The finished step for the controller: its time, tokens and draft rows, each request's accepted drafts;
    then the head's gaps and finished requests; and the periodic `p_eagle depth:` log line."""
    now = time.perf_counter()
    if self._peagle_last_step is not None and scheduler_output.total_num_scheduled_tokens:
        ctrl.observe_step(_step(scheduler_output, model_runner_output, now - self._peagle_last_step, ctrl.opt.max_k))
    self._peagle_last_step = now
    if now - self._peagle_last_log >= LOG_EVERY_S:
        self._peagle_last_log = now
        line = ctrl.summary()
        if line:
            logger.info("p_eagle depth: %s; KV blocks released early: %d; head catch-up tokens: %d", line,
                        self.peagle_blocks_released, self._peagle_gaps.caught_up)
    if scheduler_output.scheduled_spec_decode_tokens:
        index = model_runner_output.req_id_to_index
        sampled = model_runner_output.sampled_token_ids
        verified = [(req_id, len(drafts), max(len(sampled[i]) - 1, 0))  # (request, drafts, accepted)
                    for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items()
                    if (i := index.get(req_id)) is not None and i < len(sampled)]
        if verified:
            ctrl.observe(*(list(column) for column in zip(*verified)))
    self._peagle_gaps.note_step(scheduler_output.num_scheduled_tokens, drafted=drafted)
    for req_id in scheduler_output.finished_req_ids:
        ctrl.forget(req_id)
        self._peagle_gaps.forget(req_id)
        self._peagle_reserved.pop(req_id, None)
        self._peagle_seeded_ids.pop(req_id, None)


def _wrap_make_stats(original):
    @functools.wraps(original)
    def make_stats(self, *args, **kwargs):
        stats = original(self, *args, **kwargs)
        figures: EngineFigures | None = getattr(self, FIGURES_ATTR, None)
        if figures is None or stats is None:
            return stats
        now = time.perf_counter()
        carrier = getattr(stats, CARRIER_FIELD, None)
        if isinstance(carrier, dict) and (now - self._peagle_carried >= CARRY_EVERY_S or not self.requests):
            carrier.update(figures.drain())
            self._peagle_carried = now
        return stats

    return make_stats


def _wrap_post_step(original):
    @functools.wraps(original)
    def post_step(self, model_executed: bool) -> None:
        if getattr(self.scheduler, DRAFT_DEPTH_ATTR, None) == 0:
            return  # no draft ran: the worker has no draft token ids to give (see the module's doc)
        return original(self, model_executed)

    return post_step


def patch() -> None:
    """Wraps the five Scheduler methods and EngineCore.post_step once."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    if getattr(Scheduler.__init__, "__peagle_patched__", False):
        return
    Scheduler._peagle_seeded = _is_seeded
    Scheduler._peagle_lookahead = _lookahead
    Scheduler._peagle_release_surplus = _release_surplus
    for name, wrap in (("__init__", _wrap_init), ("schedule", _wrap_schedule),
                       ("update_draft_token_ids", _wrap_update_drafts),
                       ("update_from_output", _wrap_update_from_output), ("make_stats", _wrap_make_stats)):
        wrapped = wrap(getattr(Scheduler, name))
        wrapped.__peagle_patched__ = True
        setattr(Scheduler, name, wrapped)
    EngineCore.post_step = _wrap_post_step(EngineCore.post_step)
