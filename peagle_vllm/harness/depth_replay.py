"""Replays of adaptive depth without an engine: the controller (`peagle_vllm.depth`) drives a simulated
engine whose acceptance comes from recorded greedy runs and whose step times come from a table fitted to
the offline benchmark, with per-step noise and a slow drift of the machine's speed on top.

Why: on this machine the same benchmark cell varies by 40-60% between rounds, so a change to the
controller worth a few percent cannot be seen in engine runs of any affordable length; a replay sees it
in seconds, with the noise under control, and reproduces the measured ratios (adaptive against plain
decoding and the fixed K) to a few percent. Besides the table, measured in the engine: a
prompt token's cost, the head's cost per prompt token in a step that drafts, and the adaptive engine's
hooks per step (its scheduler hooks, the controller and the front end's share; a share of the step).

Acceptance: `runs[i]` is how many drafts in a row the head gets right when a step starts after the
request's i-th generated token (greedy; the target's own continuation), so a step verifying k drafts
accepts min(runs[i], k). Steps follow vLLM's order: schedule (each request's reservation, the draft
depth the deepest of them, tokens the head missed in steps without a draft computed again), run,
`observe_step` and `observe`, then `choose` for the next step (or, for a batch held in steady fallback, only
`FallbackHold`, as the engine's hook).
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from peagle_vllm.depth import DepthController, FallbackHold, Step

# a prompt token's cost beside a decode step's (a 1571-token prefill at c=16 took 172 ms; 187 tokens at c=4,
# 23 ms beyond the decode step), and the head's in a step that drafts (80 ms more for those 1571, 10 for the 187)
PREFILL_MS_PER_TOKEN = 0.11
HEAD_PROMPT_MS_PER_TOKEN = 0.05
# the adaptive engine's own hooks (scheduler hooks, the controller, the front end's share), as a share of the
# step by batch size, in steps that draft and in plain ones (fallback): each hook timed in the engine as its
# wrapper less vLLM's original (drafting: session 13, at c=4-64 with speculation held on, c=1 session 17; plain:
# session 17, held in fallback). A choice, its acceptance update and the per-request KV bookkeeping run only in
# steps that draft; in steady fallback seven steps in eight skip the controller (`FallbackHold`)
HOOKS_SHARE = {"draft": {1: 0.018, 4: 0.020, 16: 0.017, 64: 0.024},
               "plain": {1: 0.013, 4: 0.011, 16: 0.0062, 64: 0.0051}}
ROW_FREE = 16  # draft rows per request that cost nothing measurable (K=4 verified, 4..32 rows at c=1:
ROW_MS = 0.045  # 7.00, 7.21, 7.02, 7.76 ms); each row beyond costs this, per request


def hooks_share(batch: int, drafts: bool) -> float:
    """`HOOKS_SHARE` at this batch size, interpolated on log(batch) (the nearest end's share beyond)."""
    table = HOOKS_SHARE["draft" if drafts else "plain"]
    sizes = sorted(table)
    if batch <= sizes[0] or batch >= sizes[-1]:
        return table[sizes[0] if batch <= sizes[0] else sizes[-1]]
    return _between(sizes, batch, table.__getitem__)


def _between(sizes: list[int], batch: int, value: Callable[[int], float]) -> float:
    """value(b) interpolated on log(batch) between the tabulated sizes on either side of `batch`."""
    hi = bisect_left(sizes, batch)
    lo = hi - 1
    f = (math.log(batch) - math.log(sizes[lo])) / (math.log(sizes[hi]) - math.log(sizes[lo]))
    return value(sizes[lo]) + f * (value(sizes[hi]) - value(sizes[lo]))


@dataclass
class StepCosts:
    """Milliseconds of an engine step: `plain[b]` for a plain step at batch b, and `extra[b]` the
    (x, ms) points of what running the draft adds, x being 2 x the drafts verified per request (the
    points come from fixed-K cells, where x = 2K). Batch sizes between two tabulated ones are
    interpolated on log(batch); beyond the largest, costs grow with the batch."""

    plain: dict[int, float]
    extra: dict[int, list[tuple[float, float]]]
    head_prompt_ms: float = HEAD_PROMPT_MS_PER_TOKEN  # the head's cost per prompt token, in a step that drafts

    def _by_batch(self, batch: int, value: Callable[[int], float]) -> float:
        sizes = sorted(self.plain)
        if batch <= sizes[0]:
            return value(sizes[0])
        if batch >= sizes[-1]:
            return value(sizes[-1]) * batch / sizes[-1]
        return _between(sizes, batch, value)

    def _extra(self, size: int, x: float) -> float:
        points = self.extra[size]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if x <= x1:
                return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
        return points[-1][1]

    def step_ms(self, batch: int, verified: int, draft_rows: int, prompt_tokens: int) -> float:
        ms = self._by_batch(batch, lambda b: self.plain[b]) + PREFILL_MS_PER_TOKEN * prompt_tokens
        if draft_rows:
            ms += self.head_prompt_ms * prompt_tokens
            x = 2 * verified / batch
            ms += self._by_batch(batch, lambda b: self._extra(b, x))
            ms += ROW_MS * max(draft_rows / batch - ROW_FREE, 0) * batch
        return ms


@dataclass
class Request:
    rid: str
    prompt_tokens: int
    runs: list[int]
    generated: int = 0
    k: int = 0  # drafts to verify in the next step
    reserved: int = 0
    missed: int = 0  # tokens the head has not seen (steps without a draft)


@dataclass
class Noise:
    """Per-step noise (log-normal, `step` sd) times a drift of the machine's speed (an AR(1) process on
    its log with sd `drift`, some `memory` steps long)."""

    step: float = 0.05
    drift: float = 0.15
    memory: int = 500
    seed: int = 0
    _log: float = 0.0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def factor(self) -> float:
        a = 1.0 - 1.0 / self.memory
        self._log = a * self._log + self.drift * math.sqrt(1 - a * a) * self._rng.gauss(0.0, 1.0)
        return math.exp(self._log) * max(0.5, self._rng.gauss(1.0, self.step))


def replay(requests: list[Request], concurrency: int, costs: StepCosts, new_tokens: int, noise: Noise,
           controller: DepthController | None = None, fixed_k: int = 0) -> float:
    """Tokens per second of one benchmark cell: `requests` all submitted at once to an engine running at
    most `concurrency` together; adaptive depth when a controller is given, else K = `fixed_k` (0: no
    speculation). A controller keeps its state across calls, as an engine does across cells."""
    waiting, running = deque(requests), []
    seconds = tokens_out = 0.0
    hold = FallbackHold()
    while running or waiting:
        while waiting and len(running) < concurrency:
            running.append(waiting.popleft())
        batch, engine_holds = len(running), min(len(running) + len(waiting), concurrency)
        if controller is not None:
            for r in running:
                r.reserved = controller.reservation(r.rid, engine_holds)
            depth = max(r.reserved for r in running)
        else:
            depth = fixed_k
        prompt = sum(r.prompt_tokens for r in running if not r.generated)
        verified = sum(r.k for r in running if r.generated)
        for r in running:  # the head catches up before it drafts again
            if r.generated and r.missed and depth and r.reserved:
                prompt, r.missed = prompt + r.missed, 0
        tokens = prompt + batch - sum(1 for r in running if not r.generated) + verified
        emitted = 0
        results = []
        for r in running:
            accepted = min(r.runs[r.generated - 1], r.k) if r.generated else 0
            results.append((r, r.k if r.generated else 0, accepted))
            n = min(accepted + 1, new_tokens - r.generated)
            r.generated += n
            emitted += n
            if not depth:
                r.missed += n
        ms = costs.step_ms(batch, verified, depth * batch, prompt)
        if controller is not None:
            ms *= 1.0 + hooks_share(batch, depth > 0)
        step = ms * noise.factor() / 1e3
        seconds += step
        tokens_out += emitted
        running = [r for r in running if r.generated < new_tokens]
        if controller is not None and (depth or len(running) < batch
                                       or not hold.holds({r.rid for r, _, _ in results}, tokens)):
            hold.release(controller)
            controller.observe_step(Step(tokens=tokens, draft_rows=depth * batch, seconds=step, requests=batch,
                                         emitted=emitted, verified=verified))
            controller.observe([r.rid for r, _, _ in results], [k for _, k, _ in results], [a for _, _, a in results])
            for r, _, _ in results:
                if r.generated >= new_tokens:
                    controller.forget(r.rid)
            if running:
                caps = [r.reserved if depth else 0 for r in running]
                ids = [r.rid for r in running]
                for r, k in zip(running, controller.choose(ids, caps)):
                    r.k = k
                if not depth:
                    hold.start(controller, ids)
        elif controller is not None:  # one more step of a batch held in fallback, as the engine's hook does
            hold.keep(controller, step, emitted)
        else:
            for r in running:
                r.k = fixed_k
    if controller is not None:
        hold.release(controller)
    return tokens_out / seconds
