"""A fourth source of training prompts, written by the target itself: its chat template rendered up to the start of
a user turn, and the target left to write that turn (sampled), as the Magpie method draws instruction data from
aligned models. The messages follow the target's own chat training, phrased as its users phrase them.

Rules: a message is kept when the target ended its turn itself, it has at least MIN_WORDS words, no message kept
before reads the same (case and spacing aside), and it shares less than HELD_OUT_OVERLAP of its subject words with
every held-out evaluation message. Generation runs in rounds until `count` are kept, and what is kept is written to
`path` after every round, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from peagle_vllm.train.prompts import EVAL_PROMPTS, subject_overlap

SOURCE = "user-turns"  # this source's name in `peagle-vllm distill --source` and the build script's data sets
MIN_WORDS = 4
HELD_OUT_OVERLAP = 0.6
MAX_TOKENS = 96  # a longer turn is cut, and left out
EMPTY_ROUNDS = 4


def user_turn_prefix(tokenizer) -> str:
    """The chat template rendered up to where a user's message begins (its system turn included)."""
    marker = "\x00USER\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return text[:text.index(marker)]


def _key(message: str) -> str:
    return " ".join(message.lower().split())


def keep(message: str, seen: set[str], held_out: list[str]) -> bool:
    """Whether a finished user turn joins the prompts (see the module's rules); adds it to `seen` when it does."""
    if len(message.split()) < MIN_WORDS or _key(message) in seen:
        return False
    if any(subject_overlap(message, other) >= HELD_OUT_OVERLAP for other in held_out):
        return False
    seen.add(_key(message))
    return True


def user_turns(target: str, path: Path, count: int, per_round: int | None = None, temperature: float = 1.0,
               top_p: float = 0.95, log=print) -> list[str]:
    """`count` user messages the target writes (kept by the module's rules), read from `path` when it already
    holds them; `path` keeps {"prompts", "drawn", "seconds"} after every round (of twice `count` draws, 64 to
    512). EMPTY_ROUNDS rounds in a row that keep nothing stop the run: the target does not write user turns."""
    path = Path(path)
    per_round = per_round or min(512, max(64, 2 * count))
    empty = 0
    record = json.loads(path.read_text()) if path.exists() else {"prompts": [], "drawn": 0, "seconds": 0.0}
    if len(record["prompts"]) >= count:
        return record["prompts"][:count]
    from vllm import SamplingParams

    from peagle_vllm.harness.runs import close_llm, make_llm, set_cpu_defaults

    set_cpu_defaults()
    held_out = json.loads(EVAL_PROMPTS.read_text())
    seen = {_key(p) for p in record["prompts"]}
    llm = make_llm(target, None, max_model_len=1024, max_num_seqs=per_round)
    prefix = user_turn_prefix(llm.get_tokenizer())
    try:
        while len(record["prompts"]) < count:
            params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=MAX_TOKENS,
                                     seed=record["drawn"] + i) for i in range(per_round)]
            t0 = time.time()
            outs = llm.generate([prefix] * per_round, params, use_tqdm=False)
            record["seconds"] += time.time() - t0
            record["drawn"] += per_round
            ended = [o.outputs[0].text.strip() for o in outs if o.outputs[0].finish_reason == "stop"]
            kept = [message for message in ended if keep(message, seen, held_out)]
            empty = 0 if kept else empty + 1
            if empty == EMPTY_ROUNDS:
                raise ValueError(f"{target} wrote no usable user turn in {EMPTY_ROUNDS * per_round} tries (each must "
                                 f"end within {MAX_TOKENS} tokens and hold {MIN_WORDS} words or more): use another "
                                 "--source")
            record["prompts"] += kept
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1))
            tmp.replace(path)
            log(f"user turns: {min(len(record['prompts']), count)}/{count} kept of {record['drawn']} drawn "
                f"({record['seconds']:.0f} s)")
    finally:
        close_llm(llm)
    return record["prompts"][:count]
