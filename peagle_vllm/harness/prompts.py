"""Evaluation prompts for the demo, acceptance and benchmarks: user messages (the held-out, hand-written
`peagle_vllm/data/eval_prompts.json`, or a `--prompts-file` of the user's), turned into prompts with the
target's chat template; the tiny demo target, trained on code, keeps its held-out code prompts."""

from __future__ import annotations

import json
from pathlib import Path

from peagle_vllm.train.prompts import EVAL_PROMPTS


class PromptsFileError(ValueError):
    """A --prompts-file that cannot be used; the message names the file and the fix."""


def read_user_messages(path: str | Path) -> list[str]:
    """A JSON list of user messages (strings)."""
    path = Path(path)
    try:
        messages = json.loads(path.read_text())
    except OSError as exc:
        raise PromptsFileError(f"--prompts-file {path}: cannot be read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise PromptsFileError(f"--prompts-file {path} is not valid JSON ({exc}): give a JSON list of user "
                               'messages, e.g. ["Write a haiku.", "What is 2+2?"]') from exc
    if not isinstance(messages, list) or not messages or not all(isinstance(m, str) and m for m in messages):
        raise PromptsFileError(f"--prompts-file {path} must hold a non-empty JSON list of non-empty strings "
                               '(user messages), e.g. ["Write a haiku.", "What is 2+2?"]')
    return messages


def is_code_target(target: str | Path) -> bool:
    """The tiny demo target (trained on the standard library's source): prompts are code, not chat."""
    return Path(target).name == "demo-target"


def chat_prompts(target: str | Path, messages: list[str]) -> list[str]:
    """Each message as the target's chat-template prompt (the message itself if the target has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    if not getattr(tokenizer, "chat_template", None):
        return list(messages)
    return [tokenizer.apply_chat_template([{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True)
            for m in messages]


def eval_prompts(target: str | Path, count: int | None = None, prompts_file: str | Path | None = None,
                 seed: int = 0) -> list[str]:
    """`count` prompts (all when None) for the target: from `prompts_file`, else the held-out set."""
    if prompts_file is None and is_code_target(target):
        from peagle_vllm.harness.corpus import held_out_prompts

        return held_out_prompts(count or 16, seed=seed)
    messages = read_user_messages(prompts_file or EVAL_PROMPTS)
    if count is not None:
        messages = (messages * (count // len(messages) + 1))[:count]
    return chat_prompts(target, messages)
