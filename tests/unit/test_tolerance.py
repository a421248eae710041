"""Opt-in lossy acceptance (speculators' verifier_accept_k / accept_tolerance) for greedy requests: the rule on
tensors, its lossless settings, its config keys, and its settings declared by a checkpoint (kept, never used)."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from peagle_vllm.config import PEagleConfigError, split_p_eagle_config
from peagle_vllm.verify import target_probs, verify, verify_greedy, verify_tolerant, within_tolerance

GOOD = {"method": "p_eagle", "model": "/heads/x", "num_speculative_tokens": 8}
VLLM_KEYS = {"model", "num_speculative_tokens"}


def _logits(*logprobs_of_position: dict[int, float], vocab: int = 12) -> torch.Tensor:
    """[1, K, V] logits whose log-softmax puts the given log-probabilities (up to a constant per position) on
    the given tokens; every other token gets -20."""
    out = torch.full((1, len(logprobs_of_position), vocab), -20.0)
    for pos, values in enumerate(logprobs_of_position):
        for token, value in values.items():
            out[0, pos, token] = value
    return out


# position 0: token 3 is the target's argmax, 7 is 0.5 below it, 9 is 2.0 below, 5 is 2.5 below
GAPS = {3: 0.0, 7: -0.5, 9: -2.0, 5: -2.5}


def _one(draft: int, accept_k: int, tolerance: float) -> bool:
    logits = _logits(GAPS)
    return bool(within_tolerance(torch.tensor([[draft]]), logits, logits.argmax(-1), accept_k, tolerance)[0, 0])


def test_draft_in_top_k_and_within_tolerance_is_accepted_and_outside_either_is_not() -> None:
    assert _one(3, 2, 1.0), "the argmax itself"
    assert _one(7, 2, 1.0), "second most likely, 0.5 below the top: within k=2 and tolerance 1"
    assert not _one(7, 2, 0.4), "within the top 2 but 0.5 > tolerance 0.4"
    assert not _one(9, 2, 10.0), "third most likely: outside the top 2 whatever the tolerance"
    assert not _one(9, 3, 1.9), "within the top 3 but 2.0 > tolerance 1.9"
    assert _one(9, 3, 2.0), "log p_top - log p_draft <= tolerance includes equality"
    assert not _one(5, 3, 5.0), "fourth most likely: outside the top 3"


def test_acceptance_stops_at_the_first_position_failing_the_rule_then_emits_the_targets_argmax() -> None:
    near = {2: 0.0, 4: -0.3}  # argmax 2, token 4 0.3 below
    far = {6: 0.0, 8: -3.0}  # argmax 6, token 8 3.0 below
    logits = _logits(near, near, far, near)
    argmax = logits.argmax(-1)
    drafts = torch.tensor([[2, 4, 8, 2]])  # exact, within tolerance, too far, exact
    res = verify_tolerant(drafts, torch.tensor([4]), logits, argmax, torch.tensor([11]), accept_k=2, tolerance=1.0)
    assert res.num_accepted.tolist() == [2]
    assert res.tokens.tolist() == [[2, 4, 6, -1, -1]], "accepted prefix, then the target's argmax at position 2"
    all_pass = torch.tensor([[2, 4, 6, 4]])
    res = verify_tolerant(all_pass, torch.tensor([4]), logits, argmax, torch.tensor([11]), accept_k=2, tolerance=1.0)
    assert res.tokens.tolist() == [[2, 4, 6, 4, 11]], "every draft passes: the bonus (the last row's argmax) follows"
    res = verify_tolerant(all_pass, torch.tensor([1]), logits, argmax, torch.tensor([11]), accept_k=2, tolerance=1.0)
    assert res.tokens.tolist() == [[2, 11, -1, -1, -1]], "padding past num_draft is never accepted"


def _random_case(seed: int, b: int = 16, k: int = 8, v: int = 50):
    """logits [B, K, V], their argmax, drafts [B, K] (mostly the argmax, else the second most likely token or a
    random one; -1 past num_draft), num_draft [B], bonus [B]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k, v, generator=g) * 2
    argmax = logits.argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, argmax, logits.topk(2, -1).indices[..., 1])
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.2, torch.randint(0, v, (b, k), generator=g), drafts)
    num = torch.randint(0, k + 1, (b,), generator=g)
    drafts[torch.arange(k) >= num.unsqueeze(1)] = -1
    return logits, argmax, drafts, num, torch.randint(0, v, (b,), generator=g)


@pytest.mark.parametrize("accept_k,tolerance", [(1, 0.0), (1, 5.0), (4, 0.0), (50, 0.0)])
def test_lossless_settings_equal_greedy_verification(accept_k: int, tolerance: float) -> None:
    """accept_k 1 or tolerance 0 is exact match only, on random inputs, ties included (tolerance 0 would accept
    a token tied with the top one under the raw rule: the lossless settings never do)."""
    for seed in range(5):
        logits, argmax, drafts, num, bonus = _random_case(seed)
        logits[0, 0, (argmax[0, 0] + 1) % logits.shape[-1]] = logits[0, 0, argmax[0, 0]]  # a tie with the top token
        drafts[0, 0] = (argmax[0, 0] + 1) % logits.shape[-1]
        exact = verify_greedy(drafts, num, argmax, bonus)
        res = verify_tolerant(drafts, num, logits, argmax, bonus, accept_k, tolerance)
        assert torch.equal(res.tokens, exact.tokens) and torch.equal(res.num_accepted, exact.num_accepted)
        via = verify("auto", drafts, num, None, None, argmax, bonus, torch.ones(len(num), dtype=torch.bool),
                     accept_k=accept_k, accept_tolerance=tolerance, target_logits=logits)
        assert torch.equal(via.tokens, exact.tokens)


def test_lossy_settings_accept_more_and_emit_only_rule_passing_drafts_then_argmax() -> None:
    for seed in range(5):
        logits, argmax, drafts, num, bonus = _random_case(seed)
        exact = verify_greedy(drafts, num, argmax, bonus)
        res = verify_tolerant(drafts, num, logits, argmax, bonus, accept_k=2, tolerance=1.5)
        assert bool((res.num_accepted >= exact.num_accepted).all())
        ok = within_tolerance(drafts, logits, argmax, 2, 1.5)
        for row in range(len(num)):
            n = int(res.num_accepted[row])
            assert bool(ok[row, :n].all()) and n <= int(num[row])
            after = int(bonus[row]) if n == int(num[row]) else int(argmax[row, n])
            assert res.tokens[row, n] == after
    assert bool((verify_tolerant(drafts, num, logits, argmax, bonus, 2, 1.5).num_accepted
                 > verify_greedy(drafts, num, argmax, bonus).num_accepted).any()), "the random cases exercise the rule"


def test_sampled_rows_stay_lossless_under_lossy_options() -> None:
    """In a mixed batch the lossy rule changes greedy rows only: sampled rows get the same draws as without it."""
    logits, argmax, drafts, num, bonus = _random_case(7)
    b, k, v = logits.shape
    probs = target_probs(logits.view(-1, v), torch.ones(b * k)).view(b, k, v)
    q = torch.softmax(torch.randn(b, k, v, generator=torch.Generator().manual_seed(1)), -1)
    is_greedy = torch.arange(b) % 2 == 0
    torch.manual_seed(3)
    lossless = verify("standard", drafts, num, q, probs, argmax, bonus, is_greedy)
    torch.manual_seed(3)
    lossy = verify("standard", drafts, num, q, probs, argmax, bonus, is_greedy, accept_k=3, accept_tolerance=2.0,
                   target_logits=logits)
    assert torch.equal(lossy.tokens[~is_greedy], lossless.tokens[~is_greedy])
    assert bool((lossy.num_accepted[is_greedy] >= lossless.num_accepted[is_greedy]).all())
    with pytest.raises(ValueError, match="target_logits"):
        verify("standard", drafts, num, q, probs, argmax, bonus, is_greedy, accept_k=3, accept_tolerance=2.0)


def test_options_default_to_lossless_and_lossy_needs_both_keys() -> None:
    opts, rest = split_p_eagle_config(GOOD, VLLM_KEYS)
    assert (opts.verifier_accept_k, opts.accept_tolerance, opts.lossy) == (1, 0.0, False)
    opts, rest = split_p_eagle_config({**GOOD, "verifier_accept_k": 3, "accept_tolerance": 1}, VLLM_KEYS)
    assert (opts.verifier_accept_k, opts.accept_tolerance, opts.lossy) == (3, 1.0, True)
    assert rest == {"model": "/heads/x", "num_speculative_tokens": 8}, "our keys never reach vLLM"
    assert not split_p_eagle_config({**GOOD, "verifier_accept_k": 3}, VLLM_KEYS)[0].lossy
    assert not split_p_eagle_config({**GOOD, "accept_tolerance": 2.0}, VLLM_KEYS)[0].lossy


@pytest.mark.parametrize("key,value", [
    ("verifier_accept_k", 0), ("verifier_accept_k", -2), ("verifier_accept_k", 1.5), ("verifier_accept_k", "3"),
    ("verifier_accept_k", True), ("accept_tolerance", -0.1), ("accept_tolerance", "1"), ("accept_tolerance", True),
    ("accept_tolerance", math.inf), ("accept_tolerance", math.nan),
])
def test_bad_values_name_the_field(key: str, value) -> None:
    with pytest.raises(PEagleConfigError) as err:
        split_p_eagle_config({**GOOD, key: value}, VLLM_KEYS)
    message = str(err.value)
    assert f"speculative_config['{key}']" in message and "\n" not in message


def test_checkpoint_settings_are_kept_but_never_used(tmp_path) -> None:
    """A head declaring speculators' lossy settings: read_head_config keeps them raw in extra (the rest of the
    config unchanged); the config hook says once that they are ignored, and warns once only when lossy is on."""
    from peagle_vllm.checkpoint import read_head_config, save_head
    from peagle_vllm.vllm_adapter.log import logger
    from peagle_vllm.vllm_adapter.v1.config_hook import log_acceptance
    from unit.test_head import make

    save_head(make("depth", k=8, vd=40), tmp_path, verifier="t", dtype=torch.float32)
    plain = read_head_config(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["speculators_config"]["proposal_methods"][0].update(verifier_accept_k=3, accept_tolerance=1.5)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    declared = read_head_config(tmp_path)
    assert declared.extra == {"verifier_accept_k": 3, "accept_tolerance": 1.5} and plain.extra == {}
    assert {**declared.to_dict(), "extra": {}} == plain.to_dict()

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # on the adapter's logger itself: vLLM's may not propagate to the root
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        lossless = split_p_eagle_config(GOOD)[0]
        log_acceptance(lossless, plain, str(tmp_path))
        assert not records, "nothing declared, nothing lossy: silent"
        log_acceptance(lossless, declared, str(tmp_path))
        assert [(r.levelno, "ignored" in r.getMessage()) for r in records] == [(logging.INFO, True)]
        records.clear()
        lossy = split_p_eagle_config({**GOOD, "verifier_accept_k": 2, "accept_tolerance": 0.5})[0]
        log_acceptance(lossy, plain, str(tmp_path))
        assert [r.levelno for r in records] == [logging.WARNING] and "LOSSY" in records[0].getMessage()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
