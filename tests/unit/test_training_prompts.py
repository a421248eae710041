"""Training prompts never include a held-out evaluation message, nor one in nearly the same words: neither the
prompts a data set is distilled from nor the committed data sets' conversations."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from peagle_vllm.train.prompts import EVAL_PROMPTS, SOURCES, build_prompts, subject_overlap, training_prompts

REPO = Path(__file__).resolve().parents[2]
HELD_OUT = set(json.loads(EVAL_PROMPTS.read_text()))


def test_training_prompts_leave_out_held_out_messages_and_keep_the_others_indices() -> None:
    built = build_prompts(2048)
    held_out = {built[5], built[1500], "a message no template makes"}
    assert training_prompts(0, 2048, held_out=held_out) == built[:5] + built[6:1500] + built[1501:]
    assert training_prompts(1024, 2048, held_out=held_out) == built[1024:1500] + built[1501:]
    requests = SOURCES["requests"](100)
    assert training_prompts(0, 100, held_out={requests[7]}, source="requests") == requests[:7] + requests[8:]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_no_training_prompt_is_an_evaluation_message_in_nearly_the_same_words(source: str) -> None:
    for prompt in SOURCES[source](6144):  # past every data set's prompts but the templates' (requests-b ends at 6,144)
        for message in HELD_OUT:
            shared = subject_overlap(prompt, message)
            assert shared < 0.6, f"{prompt!r} shares {shared:.0%} of its subject words with {message!r}"


def test_no_data_set_of_the_heads_answers_an_evaluation_message() -> None:
    # the first data set is not committed: the shipped heads were distilled from build_prompts' own prompts
    assert not HELD_OUT & set(build_prompts(24576)), "the evaluation set holds a message the training prompts make"
    for source in ("requests", "questions"):
        assert not HELD_OUT & set(SOURCES[source](6144)), f"the evaluation set holds a message {source} makes"
    chunks = sorted((REPO / "datasets" / "smollm2").glob("*/chunk-*.jsonl.gz"))
    assert chunks
    for chunk in chunks:
        with gzip.open(chunk, "rt") as rows:
            assert not {json.loads(row)["prompt"] for row in rows} & HELD_OUT, chunk
