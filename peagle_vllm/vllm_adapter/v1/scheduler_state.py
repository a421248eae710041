"""All that p_eagle keeps on one vLLM Scheduler, as one object (`state_of(scheduler)`): the engine figures
bound for the front end, prompt and corpus lookup where they are on, and, under adaptive depth, the controller with its
per-request bookkeeping (reservations, seeds, the head's gaps, the held fallback steps, released blocks)."""

from __future__ import annotations

import time
from pathlib import Path

from peagle_vllm.config import PEagleOptions
from peagle_vllm.corpus_lookup import CorpusLookup, read_answers
from peagle_vllm.depth import DepthController, DepthOptions, FallbackHold
from peagle_vllm.lookup import FirstFound, TokenHistory
from peagle_vllm.metrics import EngineFigures
from peagle_vllm.vllm_adapter.log import logger
from peagle_vllm.vllm_adapter.v1 import rollback_hook
from peagle_vllm.vllm_adapter.v1.carriers import PEagleMark
from peagle_vllm.vllm_adapter.v1.head_catch_up import HeadGaps

STATE_ATTR = "_peagle"  # the one attribute p_eagle sets on a Scheduler
SAMPLING_EPS = 1e-5  # vLLM's greedy threshold on temperature


def lookups_of(options: PEagleOptions) -> FirstFound | None:
    """The lookups beside the head, tried in turn: the request's own text, then the corpus; None: neither is on."""
    lookups = [] if options.prompt_lookup is None else [options.prompt_lookup]
    if options.lookup_corpus is not None:
        start = time.perf_counter()
        corpus = CorpusLookup(read_answers(Path(options.lookup_corpus)))
        logger.info("p_eagle: lookup corpus %s: %d answers, %d tokens, indexed in %.1f s", options.lookup_corpus,
                    corpus.answers, corpus.tokens, time.perf_counter() - start)
        lookups.append(corpus)
    return FirstFound(tuple(lookups)) if lookups else None


class SchedulerState:
    """Per scheduler. `ctrl` is None when K is fixed (adaptive off, or async scheduling)."""

    def __init__(self, scheduler, mark: PEagleMark, adaptive: bool, async_scheduling: bool = False) -> None:
        self.figures = EngineFigures()
        # under async scheduling drafts go from the worker to the next step without update_draft_token_ids:
        # each request's K is then read from the drafts a step verifies
        self.counts_verified_drafts = async_scheduling
        self.carried = 0.0  # when the figures last rode to the front end (see scheduler_hook's make_stats)
        self.ctrl = DepthController(DepthOptions(max_k=mark.options.num_speculative_tokens,
                                                 min_k=mark.options.min_k)) if adaptive else None
        self.last_step: float | None = None  # end of the previous engine step (None after idling)
        self.plain_next = False  # DepthController.plain_next as of this step's scheduling
        self.last_log = time.perf_counter()
        self.reserved: dict[str, int] = {}  # drafts whose lookahead is reserved, per request
        self.seeded_ids: dict[str, bool] = {}  # see is_seeded
        self.sampled_ids: dict[str, bool] = {}  # see is_sampled
        self.block_counts: dict[str, tuple[int, ...]] = {}  # released since the last schedule, for the worker
        self.gaps = HeadGaps()  # tokens the draft head has not seen (steps in fallback)
        self.hold = FallbackHold()  # steady fallback's steps that skip the controller
        self.blocks_released = 0  # blocks handed back before their request ended
        self.trimmable = rollback_hook.trimmable_managers(scheduler) if adaptive else []  # fixed for the engine's life
        # requests' drafts from their own text, else a corpus (`prompt_lookup`); drafts bypass the
        # scheduler under async scheduling
        self.lookup = None if async_scheduling else lookups_of(mark.options)
        self.max_k = mark.options.num_speculative_tokens  # what lookups may draft up to
        # the head drafted this deep (`proposer`; the drafts' columns past it are padding), lookups past it
        self.head_depth = None if self.lookup is None else mark.options.head_depth
        self.history = TokenHistory()  # each request's tokens as an array, for the lookup
        self.lookup_given: dict[str, tuple[int, ...]] = {}  # positions of each request's drafts a lookup gave

    def is_seeded(self, scheduler, req_id: str) -> bool:
        """Sampled requests with a seed keep the full K: timing-driven depth would make their samples
        unrepeatable (greedy outputs do not depend on K). Remembered until the request finishes."""
        seeded = self.seeded_ids.get(req_id)
        if seeded is None:
            request = scheduler.requests.get(req_id)
            params = getattr(request, "sampling_params", None)
            seeded = params is not None and params.seed is not None and params.temperature > SAMPLING_EPS
            if request is not None:
                self.seeded_ids[req_id] = seeded
        return seeded

    def is_sampled(self, scheduler, req_ids) -> bool:
        """Whether any of these requests samples (temperature > 0): the controller prices such batches' steps with
        a cost model of their own. Remembered per request until it finishes."""
        sampled_ids = self.sampled_ids
        for rid in req_ids:
            sampled = sampled_ids.get(rid)
            if sampled is None:
                params = getattr(scheduler.requests.get(rid), "sampling_params", None)
                sampled = params is not None and params.temperature > SAMPLING_EPS
                if params is not None:
                    sampled_ids[rid] = sampled
            if sampled:
                return True
        return False

    def lookahead(self, scheduler, request) -> int:
        """Draft-head slots to reserve for this request: K_max when seeded, else what the controller may
        give it next (recorded: its drafts are then capped at that). The batch it joins is what the engine
        holds, up to its limit (requests arriving together come as one batch)."""
        rid = request.request_id
        if self.plain_next and self.reserved.get(rid) == 0:
            return 0  # a request at K=0 stays there (see DepthController.plain_next)
        batch = min(len(scheduler.running) + len(scheduler.waiting), scheduler.max_num_running_reqs)
        k = self.ctrl.opt.max_k if self.is_seeded(scheduler, rid) else self.ctrl.reservation(rid, batch)
        self.reserved[rid] = k
        return k

    def release_surplus(self, scheduler, req_ids: list[str]) -> None:
        """Hands back the blocks each request's next step will not touch (after its K was chosen)."""
        for rid in req_ids:
            request = scheduler.requests.get(rid)
            if request is None or request.is_finished():
                continue
            lookahead = self.ctrl.opt.max_k if self.is_seeded(scheduler, rid) else self.ctrl.reservation(rid)
            released = rollback_hook.release_surplus(self.trimmable, request, lookahead)
            if released is not None:
                self.block_counts[rid] = released[0]
                self.blocks_released += released[1]

    def note_lookup_drafts(self, req_ids: list[str], by_lookup: list[list[bool]], drafts: list[list[int]]) -> None:
        """Each request's drafts as cut to its K (drafts [R][<= K]) and which of them a lookup gave (by_lookup
        [R][...]): counted, and the positions kept until the step that verifies them is scheduled."""
        for rid, given, row in zip(req_ids, by_lookup, drafts):
            positions = tuple(i for i, g in enumerate(given[:len(row)]) if g)
            self.figures.lookup_drafts += len(positions)
            if positions:
                self.lookup_given[rid] = positions
            else:
                self.lookup_given.pop(rid, None)

    def take_lookup_positions(self, scheduler_output) -> dict[str, tuple[int, ...]]:
        """{request: positions of its drafts scheduled in this step that a lookup gave}. vLLM hands a scheduled
        request's drafts to the step (those past what fits cut) and clears them, so its positions go with them."""
        if not self.lookup_given:
            return {}
        spec = scheduler_output.scheduled_spec_decode_tokens
        out = {}
        for rid in scheduler_output.num_scheduled_tokens:
            positions = self.lookup_given.pop(rid, None)
            if positions and rid in spec:
                n = len(spec[rid])
                out[rid] = tuple(p for p in positions if p < n)
        return out

    def forget(self, req_id: str) -> None:
        """A finished request leaves every per-request table."""
        self.ctrl.forget(req_id)
        self.gaps.forget(req_id)
        self.reserved.pop(req_id, None)
        self.seeded_ids.pop(req_id, None)
        self.sampled_ids.pop(req_id, None)


def state_of(scheduler) -> SchedulerState | None:
    """The scheduler's p_eagle state; None for a scheduler of another method (or none)."""
    return getattr(scheduler, STATE_ATTR, None)
