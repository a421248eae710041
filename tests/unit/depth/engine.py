"""The simulated engine the controller's unit tests share: requests decoded step by step, the controller driven as
vLLM's scheduler hooks drive it, with synthetic acceptance and step times.

Each step, in the engine's order: every request's reservation (the head drafts as deep as the deepest), the drafts
chosen at the step before verified (a request accepts each draft in a row with its own rate), the step timed, the
controller told (`observe`, `observe_step`), finished requests forgotten, then `choose` for the next step within the
reservations. With a `FallbackHold`, plain decode steps of a batch held in steady fallback skip the controller, as
the engine's hook does. Requests come in waves: a wave's requests start together (with a prefill step of `prompt`
tokens each, or straight into decoding) and run until each has its tokens; the next wave follows. A fixed K instead
of a controller gives the fixed-K reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from peagle_vllm.depth import DepthController, DepthOptions, FallbackHold, Step

# seconds of a step: (its index from the engine's first, tokens computed, draft rows run, the engine's generator)
StepSeconds = Callable[[int, int, int, np.random.Generator], float]


@dataclass
class LinearCosts:
    """A step computing T tokens lasts base + per_token T, plus draft + per_row D when a draft of D rows runs, times
    log-normal noise with relative sd `noise` (mean 1; drawn every step, also at 0)."""

    base: float = 1.0
    per_token: float = 0.02
    draft: float = 0.0
    per_row: float = 0.0
    noise: float = 0.0

    def __call__(self, index: int, tokens: int, draft_rows: int, rng: np.random.Generator) -> float:
        mean = self.base + self.per_token * tokens + ((self.draft + self.per_row * draft_rows) if draft_rows else 0.0)
        return mean * float(np.exp(self.noise * rng.standard_normal() - self.noise ** 2 / 2))

    def plain_seconds(self, batch: int, prompt: int, tokens: int) -> float:
        """Seconds plain decoding takes (at the mean cost) for a wave of `batch` requests of `tokens` tokens each,
        opened by a prefill of `prompt` tokens each."""
        return self.base + self.per_token * batch * prompt + (tokens - 1) * (self.base + self.per_token * batch)


def by_tokens(drafting: dict[int, float], noise: float = 0.05) -> StepSeconds:
    """A step that runs a draft lasts `drafting` at its tokens computed (interpolated between the given counts, the
    nearest beyond), any other 1 + 0.01 per token; log-normal noise of relative sd `noise` on both."""
    counts = sorted(drafting)

    def seconds(index: int, tokens: int, draft_rows: int, rng: np.random.Generator) -> float:
        mean = float(np.interp(tokens, counts, [drafting[t] for t in counts])) if draft_rows else 1.0 + 0.01 * tokens
        return mean * float(np.exp(noise * rng.standard_normal() - noise ** 2 / 2))
    return seconds


def two_speeds(plain_s: float | list[float], spec_s: float) -> StepSeconds:
    """A step that runs a draft lasts `spec_s`, any other `plain_s` (or the entry of that list at its index)."""
    if isinstance(plain_s, list):
        return lambda index, tokens, rows, rng: spec_s if rows else plain_s[index]
    return lambda index, tokens, rows, rng: spec_s if rows else plain_s


@dataclass
class Request:
    """A simulated request: how it accepts drafts, and how many tokens it wants."""

    rid: str
    alpha: float  # chance of accepting each draft, in a row
    tokens: float = np.inf  # tokens it wants (its first step's included)
    start: tuple[int, float] = (0, 0.0)  # its first n steps accept at this rate instead


@dataclass
class Wave:
    """What a wave's steps did, each counted from the wave's first step."""

    depth: list[int] = field(default_factory=list)  # draft depth of each step (the deepest reservation; 0: none)
    verified: list[int] = field(default_factory=list)  # drafts verified at each step
    held: int = 0  # steps held in fallback, without the controller

    @property
    def drafted(self) -> list[int]:
        """The steps that ran a draft."""
        return [i for i, d in enumerate(self.depth) if d]


class Engine:
    """Waves of requests through one controller (or at a fixed K when `controller` is None); `steps`, `emitted` and
    `seconds` add up over every step run."""

    def __init__(self, controller: DepthController | None, seconds: StepSeconds, seed: int = 0,
                 fixed_k: int = 0, hold: bool = False) -> None:
        self.ctrl, self.step_seconds, self.fixed_k = controller, seconds, fixed_k
        self.rng = np.random.default_rng(seed)
        self.hold = FallbackHold() if hold else None
        self.steps = 0
        self.emitted = 0
        self.seconds = 0.0

    def wave(self, requests: list[Request], prompt: int = 0, steps: float = np.inf) -> Wave:
        """These requests, started together, until each has its tokens or `steps` steps have run; with `prompt` > 0
        their first step is a prefill of that many tokens each."""
        ctrl, rng, hold, log = self.ctrl, self.rng, self.hold, Wave()
        left = {r.rid: r.tokens for r in requests}  # tokens each request still wants
        by_id = {r.rid: r for r in requests}
        ks = dict.fromkeys(left, 0)  # drafts each request verifies next
        index, prefill = 0, prompt > 0
        while left and index < steps:
            ids = list(left)
            if ctrl is None:
                depth = self.fixed_k
            else:
                caps = [ctrl.reservation(r, len(ids)) for r in ids]
                depth = max(caps)
            verifying = [ks[r] for r in ids]
            accepted = [_accepted(rng, k, _rate(by_id[r], index)) for r, k in zip(ids, verifying)]
            verified, emitted = sum(verifying), len(ids) + sum(accepted)
            tokens = len(ids) * prompt if prefill else len(ids) + verified
            seconds = self.step_seconds(self.steps, tokens, len(ids) * depth, rng)
            self.steps, self.emitted, self.seconds = self.steps + 1, self.emitted + emitted, self.seconds + seconds
            log.depth.append(depth)
            log.verified.append(verified)
            for r, a in zip(ids, accepted):
                left[r] -= 1 + a
            done = [r for r in ids if left[r] <= 0]
            index, plain_decode, prefill = index + 1, not (depth or verified or prefill), False
            for r in done:
                del left[r]
            if ctrl is None:
                ks.update(dict.fromkeys(left, self.fixed_k))
                continue
            if hold is not None and plain_decode and not done and hold.holds(set(ids), tokens):
                hold.keep(ctrl, seconds, emitted)  # one more step of a batch held in fallback
                log.held += 1
                continue
            if hold is not None:
                hold.release(ctrl)
            ctrl.observe(ids, verifying, accepted)
            ctrl.observe_step(Step(tokens, len(ids) * depth, seconds, len(ids), emitted, verified))
            for r in done:
                ctrl.forget(r)
            if left:
                ks.update(zip(left, ctrl.choose(list(left), [c for r, c in zip(ids, caps) if r in left])))
                if hold is not None and not depth:
                    hold.start(ctrl, list(left))
        if hold is not None and ctrl is not None:
            hold.release(ctrl)
        return log


def _rate(request: Request, index: int) -> float:
    return request.start[1] if index < request.start[0] else request.alpha


def _accepted(rng: np.random.Generator, k: int, alpha: float) -> int:
    """Drafts accepted in a row out of k, each with chance alpha (k draws)."""
    return int(np.argmin(np.append(rng.random(k) < alpha, False)))


def steady_batch(alpha: float, draft_overhead: float, steps: int = 600, batch: int = 8, token_cost: float = 0.02,
                 row_cost: float = 0.0, noise: float = 0.0, fixed_k: int | None = None, seed: int = 0) -> float:
    """One batch decoding for `steps` steps, every request accepting at `alpha` (`LinearCosts`: base 1, the draft
    costing `draft_overhead`): its tokens per second over plain decoding's, adaptive depth (K_max 16) or `fixed_k`."""
    costs = LinearCosts(1.0, token_cost, draft_overhead, row_cost, noise)
    engine = Engine(DepthController(DepthOptions(max_k=16)) if fixed_k is None else None, costs, seed,
                    fixed_k=fixed_k or 0)
    engine.wave([Request(f"r{i}", alpha) for i in range(batch)], steps=steps)
    return (engine.emitted / engine.seconds) / (batch / (costs.base + costs.per_token * batch))


def waves(alpha: float, draft_overhead: float, batches: list[int], wave_tokens: int = 64,
          noise: float = 0.2) -> tuple[float, list[list[int]]]:
    """Waves of new requests as a benchmark runs them: a wave per entry of `batches`, each request wanting
    `wave_tokens` tokens after a prefill of 30 prompt tokens, step times noisy (base 1, 0.02 a token, the draft
    `draft_overhead`). Plain decoding's time for the same waves over the time taken (adaptive depth, K_max 16), and
    per wave the steps that ran a draft (0: its prefill)."""
    costs = LinearCosts(1.0, 0.02, draft_overhead, 0.0, noise)
    engine, plain, drafted = Engine(DepthController(DepthOptions(max_k=16)), costs, seed=1), 0.0, []
    for n, batch in enumerate(batches):
        plain += costs.plain_seconds(batch, 30, wave_tokens)
        drafted.append(engine.wave([Request(f"w{n}r{i}", alpha, wave_tokens) for i in range(batch)], prompt=30).drafted)
    return plain / engine.seconds, drafted


def one_by_one(alphas: list[float], tokens: int = 64, prompt: int = 100, draft_overhead: float = 0.75,
               fixed_k: int | None = None, seed: int = 0, options: DepthOptions | None = None,
               start: tuple[int, float] = (0, 0.0)) -> tuple[float, list[int]]:
    """Batch 1, as a benchmark at concurrency 1 runs it: requests one after another, each with its own acceptance
    rate (`start`: its first n steps at another), a prefill of `prompt` tokens, then decode steps until `tokens`
    (costs scaled from the demo engine at concurrency 1: base 1, 0.05 a token, the draft `draft_overhead` plus 0.012
    a row, step times varying by 20%). Plain decoding's time over the time taken (adaptive depth, K_max 32 by
    default, or `fixed_k`), and the steps each request waited for its first draft to be verified (`tokens`: never)."""
    costs = LinearCosts(1.0, 0.05, draft_overhead, 0.012, 0.2)
    ctrl = None if fixed_k is not None else DepthController(options or DepthOptions(max_k=32))
    engine, plain, waits = Engine(ctrl, costs, seed, fixed_k=fixed_k or 0), 0.0, []
    for n, alpha in enumerate(alphas):
        plain += costs.plain_seconds(1, prompt, tokens)
        wave = engine.wave([Request(f"r{n}", alpha, tokens, start)], prompt=prompt)
        waits.append(next((i for i, v in enumerate(wave.verified) if v), tokens))
    return plain / engine.seconds, waits


def fallback_run(plain_s: list[float], spec_s: float, held: bool) -> tuple[DepthController, list[int], int]:
    """A batch of four that falls back (no draft ever accepted; a step that drafts takes `spec_s`) over 40 plain steps
    of 10 ms, then one plain step timed per entry of `plain_s`: a choice each step, or with `held` a `FallbackHold`
    between choices. The controller, the steps of `plain_s` that drafted, and those held."""
    ctrl = DepthController(DepthOptions(max_k=4, probe_every=2))
    engine = Engine(ctrl, two_speeds([0.01] * 40 + plain_s, spec_s), hold=held)
    wave = engine.wave([Request(r, 0.0) for r in "abcd"], steps=40 + len(plain_s))
    return ctrl, [i - 40 for i in wave.drafted if i >= 40], wave.held

