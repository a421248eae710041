"""The target-written source of training prompts (harness/user_turns.py): where a user's turn begins in the chat
template, and which messages are kept."""

from __future__ import annotations

import json
from pathlib import Path

from peagle_vllm.harness.user_turns import HELD_OUT_OVERLAP, keep, user_turn_prefix
from peagle_vllm.train.prompts import EVAL_PROMPTS, subject_overlap

HELD_OUT = json.loads(EVAL_PROMPTS.read_text())


def test_the_prefix_ends_where_the_users_message_begins(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    prefix = user_turn_prefix(AutoTokenizer.from_pretrained(smollm2))
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_end|>\n<|im_start|>user\n")


def test_keep_refuses_short_repeated_and_held_out_messages() -> None:
    seen: set[str] = set()
    assert keep("How do I plan a budget for a week of travel?", seen, HELD_OUT)
    assert not keep("how do I plan a  budget for a week of TRAVEL?", seen, HELD_OUT)  # the same, case and spacing aside
    assert not keep("Hello there!", seen, HELD_OUT)
    paraphrase = "Please explain why the sky is blue."
    assert subject_overlap(paraphrase, "Why is the sky blue?") >= HELD_OUT_OVERLAP
    assert not keep(paraphrase, seen, HELD_OUT)
    assert keep("Suggest three names for a bakery by the sea.", seen, HELD_OUT)
    assert len(seen) == 2
