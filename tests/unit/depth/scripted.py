"""Scripted steps: the controller fed hand-made steps in which the K it chooses is verified at once (no engine
order, no prompts), for scenarios whose every step a test sets; the simulated engine is `engine.py`."""

from __future__ import annotations

import numpy as np

from peagle_vllm.depth import DepthController, Step


def decode_alone(ctrl: DepthController, alpha: float, steps: int, c0: float = 1.0, c1: float = 0.01,
                 rng: np.random.Generator | None = None, req: str = "r") -> list[int]:
    """Each step: choose K (no reservation), accept a geometric prefix with per-position rate alpha, report cost
    c0 + c1 x the tokens computed; the K of each step."""
    rng = rng or np.random.default_rng(0)
    ks = []
    for _ in range(steps):
        (k,) = ctrl.choose([req])
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        ctrl.observe([req], [k], [accepted])
        ctrl.observe_step(Step(1 + k, k, c0 + c1 * (1 + k), 1, 1 + accepted, k))
        ks.append(k)
    return ks


def decode_alone_reserved(ctrl: DepthController, alpha: float, steps: int,
                          c1: float = 0.01) -> tuple[list[int], list[int]]:
    """Like `decode_alone`, but as the scheduler does it: reserve lookahead first, then choose within it; the
    reservations and the K of each step."""
    rng = np.random.default_rng(0)
    reserved, ks = [], []
    for _ in range(steps):
        cap = ctrl.reservation("r")
        (k,) = ctrl.choose(["r"], [cap])
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        ctrl.observe(["r"], [k], [accepted])
        ctrl.observe_step(Step(1 + k, cap, 1.0 + c1 * (1 + k), 1, 1 + accepted, k))
        reserved.append(cap)
        ks.append(k)
    return reserved, ks


def batch_steps(ctrl: DepthController, ids: list[str], steps: int, plain_s: float, spec_s: float) -> list[int]:
    """`steps` steps of the batch `ids` (every draft accepted), timed plain_s without a draft and spec_s with one;
    the drafts verified per step."""
    drafted = []
    for _ in range(steps):
        caps = [ctrl.reservation(r, len(ids)) for r in ids]
        ks = ctrl.choose(ids, caps)
        ctrl.observe(ids, ks, ks)
        depth, verified = max(caps), sum(ks)
        ctrl.observe_step(Step(tokens=len(ids) + verified, draft_rows=depth * len(ids),
                               seconds=spec_s if depth else plain_s, requests=len(ids), emitted=len(ids) + verified,
                               verified=verified))
        drafted.append(verified)
    return drafted


def time_speeds(ctrl: DepthController, requests: int, plain_s: float, spec_s: float) -> None:
    """Ten plain and then ten speculative decode steps of `requests` requests (one draft verified per request),
    timed as given: both speeds measured at that batch size."""
    for _ in range(10):
        ctrl.observe_step(Step(tokens=requests, draft_rows=0, seconds=plain_s, requests=requests, emitted=requests))
    for _ in range(10):
        ctrl.observe_step(Step(tokens=2 * requests, draft_rows=2 * requests, seconds=spec_s, requests=requests,
                               emitted=2 * requests, verified=requests))
