"""Training data: token windows from .txt/.jsonl text, optionally continued by the target itself
(self-distillation), and the target's captured auxiliary hidden states and logits; or a directory of
conversations the target answered itself (`peagle-vllm distill`), read as token ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def is_conversation_dir(path: str | Path) -> bool:
    """True for a directory written by `peagle-vllm distill` (chunk-NNNN.jsonl files)."""
    return Path(path).is_dir() and any(Path(path).glob("chunk-*.jsonl"))


def read_conversations(path: str | Path) -> list[dict]:
    """Every row ({"prompt_ids", "response_ids", ...}) of a distillation directory, chunk by chunk."""
    rows = []
    for chunk in sorted(Path(path).glob("chunk-*.jsonl")):
        rows.extend(json.loads(line) for line in chunk.read_text().splitlines() if line.strip())
    return rows


def load_token_stream(tokenizer, path: str | Path) -> np.ndarray:
    """Token ids of the training data: a pre-tokenised .npy stream, or text read by `read_texts`."""
    if Path(path).suffix == ".npy":
        return np.load(path).astype(np.int64)
    return token_stream(tokenizer, read_texts(path))


def read_texts(path: str | Path) -> list[str]:
    """A .txt file (one text), a directory of .txt/.py files, or .jsonl with "text" or "prompt" keys."""
    path = Path(path)
    if path.is_dir():
        return [p.read_text(errors="replace") for p in sorted(path.rglob("*")) if p.suffix in (".txt", ".py")]
    if path.suffix == ".jsonl":
        out = []
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                out.append(row.get("text") or row.get("prompt") or "")
        return [t for t in out if t]
    return [path.read_text(errors="replace")]


def token_stream(tokenizer, texts: list[str]) -> np.ndarray:
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return np.asarray(ids, dtype=np.int64)


class WindowSampler:
    """Random windows of `length` tokens from a token stream, reproducible from a numpy RNG."""

    def __init__(self, stream: np.ndarray, length: int, rng: np.random.Generator) -> None:
        if len(stream) <= length + 1:
            raise ValueError(f"training data has {len(stream)} tokens, fewer than one window of {length + 1}")
        self.stream, self.length, self.rng = stream, length, rng

    def batch(self, size: int) -> torch.Tensor:
        starts = self.rng.integers(0, len(self.stream) - self.length - 1, size)
        idx = starts[:, None] + np.arange(self.length + 1)[None, :]
        return torch.from_numpy(self.stream[idx])


@torch.no_grad()
def self_distill(target, prompts: torch.Tensor, new_tokens: int, temperature: float = 1.0) -> torch.Tensor:
    """Continues each prompt [B, P] with the target's own samples -> [B, P + new_tokens]."""
    out = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=temperature > 0,
                          temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                          pad_token_id=0)
    return out[:, : prompts.shape[1] + new_tokens]


@torch.no_grad()
def capture(target, ids: torch.Tensor, aux_layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Target forward over ids [B, T]: auxiliary states [B, T, 3*Ht] (hidden state after layer i, before
    the final norm, as vLLM exposes them) and logits [B, T, V]."""
    num_layers = target.config.num_hidden_layers
    if any(not 0 <= i < num_layers for i in aux_layer_ids):
        raise ValueError(f"aux layer ids {aux_layer_ids} must lie in 0..{num_layers - 1} (ids equal to the "
                         "layer count would read the final-normed state, which vLLM does not expose)")
    out = target(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in aux_layer_ids], dim=-1)
    return aux.float(), out.logits.float()
