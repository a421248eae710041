"""The draft temperature's calibration, on tensors: it finds the factor that makes a head's q the target's p."""

from __future__ import annotations

import pytest
import torch

from peagle_vllm.draft_temperature import (DraftTemperatureError, acceptance_rates, calibrate, checked,
                                           expected_length)
from peagle_vllm.verify import target_probs


def _target_logits(n: int = 64, k: int = 3, v: int = 500) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(n, k, v) * 3


def _p(logits: torch.Tensor) -> torch.Tensor:
    n, k, v = logits.shape
    return target_probs(logits.reshape(-1, v), torch.ones(n * k)).view(n, k, v)


@pytest.mark.parametrize("flatness", [0.5, 1.0, 1.3])
def test_a_head_flatter_or_sharper_than_the_target_calibrates_to_its_own_factor(flatness: float) -> None:
    target = _target_logits()
    best, scores = calibrate(target, target * flatness, None)  # q at factor s: softmax(flatness * z / s)
    assert best == pytest.approx(flatness)
    assert scores[best] == pytest.approx(3.0, abs=1e-4)  # q == p: every draft accepted
    assert all(v < scores[best] for s, v in scores.items() if s != best)


def test_a_draft_vocabulary_reads_the_target_at_its_own_ids() -> None:
    target = _target_logits(v=500)
    ids = torch.arange(0, 500, 2)  # the draft vocabulary: every second target token
    alpha = acceptance_rates(_p(target), target[:, :, ids], ids, 1.0)
    # q is p restricted to the draft ids and renormalised: overlap = the mass p puts on those ids
    assert torch.allclose(alpha, _p(target)[:, :, ids].sum(-1), atol=1e-5)


def test_expected_length_is_the_sum_of_prefix_products() -> None:
    alpha = torch.tensor([[0.5, 0.5, 1.0], [1.0, 0.0, 1.0]])
    assert expected_length(alpha).tolist() == [0.5 + 0.25 + 0.25, 1.0]


def test_top_p_cuts_both_the_target_and_the_draft_distribution() -> None:
    target = _target_logits()
    _, scores = calibrate(target, target, None, top_p=0.9, scales=(1.0,))
    assert scores[1.0] == pytest.approx(3.0, abs=1e-4)  # cut alike: still the same distribution
    uncut_p = acceptance_rates(_p(target), target, None, 1.0, top_p=0.9)
    assert (uncut_p < 0.99).all()  # q alone cut: the target's tail is never drafted


@pytest.mark.parametrize("value", [0, -0.5, 9, float("nan"), True, "0.7", None])
def test_a_factor_outside_0_to_8_is_one_line_naming_where(value) -> None:
    with pytest.raises(DraftTemperatureError, match="^here must be a number above 0") as err:
        checked(value, "here")
    assert "\n" not in str(err.value)
    assert checked(0.75, "here") == 0.75
