"""Acceptance figures from V2's observe_verification hook: counted on the device, reported every window."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_counts_and_low_acceptance_warning() -> None:
    from peagle_vllm.vllm_adapter.log import LOGGER_NAME
    from peagle_vllm.vllm_adapter.v2.metrics import VerificationCounts

    handler = _Lines()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        counts = VerificationCounts(k=4, device="cpu", warn_below=0.75, window=2)
        # step 1: r0 accepted 1 of 4, r1 prefilling; step 2: r0 accepted 4 of 4, r1 accepted 0 of 4
        counts.observe(torch.tensor([2, 0]), torch.tensor([3, 0]))
        assert counts.last_window_rate is None and not handler.lines  # nothing read before the window fills
        counts.count_lookup(torch.tensor([[True, True, False, False], [False] * 4]))  # r0's first two drafts
        counts.observe(torch.tensor([5, 1]), torch.tensor([0, 4]))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert counts.last_window_rate == pytest.approx(5 / 12)
    assert counts.accepted_per_position.tolist() == [2, 1, 1, 1]
    assert counts.drafted_per_position.tolist() == [3, 3, 3, 3]
    assert any("below 75%" in line for line in handler.lines)
    line = next(line for line in handler.lines if line.startswith("p_eagle metrics: block acceptance 41.7%"))
    assert line.endswith("; drafts from lookups so far: 2")
