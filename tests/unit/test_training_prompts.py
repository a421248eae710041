"""Training prompts never include a held-out evaluation message: neither the prompts a data set is distilled
from nor the committed data sets' conversations."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from peagle_vllm.train.prompts import EVAL_PROMPTS, build_prompts, training_prompts

REPO = Path(__file__).resolve().parents[2]
HELD_OUT = set(json.loads(EVAL_PROMPTS.read_text()))


def test_training_prompts_leave_out_held_out_messages_and_keep_the_others_indices() -> None:
    built = build_prompts(2048)
    held_out = {built[5], built[1500], "a message no template makes"}
    assert training_prompts(0, 2048, held_out=held_out) == built[:5] + built[6:1500] + built[1501:]
    assert training_prompts(1024, 2048, held_out=held_out) == built[1024:1500] + built[1501:]


def test_no_data_set_of_the_heads_answers_an_evaluation_message() -> None:
    # the first data set is not committed: the shipped heads were distilled from build_prompts' own prompts
    assert not HELD_OUT & set(build_prompts(24576)), "the evaluation set holds a message the training prompts make"
    chunks = sorted((REPO / "datasets" / "smollm2").glob("*/chunk-*.jsonl.gz"))
    assert chunks
    for chunk in chunks:
        with gzip.open(chunk, "rt") as rows:
            assert not {json.loads(row)["prompt"] for row in rows} & HELD_OUT, chunk
