"""Builds the demo target: a byte-level BPE tokenizer (with a mask token) and a small Llama, both
trained on this machine from the standard-library corpus, saved in Hugging Face layout for vLLM.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from peagle_vllm.harness.corpus import corpus_files, read_text

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
PAD_TOKEN = "<|pad|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '### ' + m['role'] + '\n' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant\n' }}{% endif %}"
)


@dataclass
class TargetRecipe:
    """Everything that determines the demo target; recorded next to the weights."""

    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 2048
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 2000
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0


def train_tokenizer(out_dir: Path, vocab_size: int) -> None:
    """Byte-level BPE over the train split, saved as a transformers fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        (read_text(p) for p in corpus_files("train")),
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, MASK_TOKEN, PAD_TOKEN],
        show_progress=False,
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok._tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        mask_token=MASK_TOKEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def encode_split(tokenizer_dir: Path, split: str, cache: Path) -> np.ndarray:
    """Token stream of a split (files joined by EOS), cached as uint16."""
    if cache.exists():
        return np.load(cache)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = [read_text(p) for p in corpus_files(split)]
    ids: list[int] = []
    for enc in tok(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tok.eos_token_id)
    arr = np.asarray(ids, dtype=np.uint16)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, arr)
    return arr


def _batch(stream: np.ndarray, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(stream[idx].astype(np.int64))


def _lr_at(step: int, r: TargetRecipe) -> float:
    if step < r.warmup_steps:
        return r.lr * (step + 1) / r.warmup_steps
    progress = (step - r.warmup_steps) / max(1, r.steps - r.warmup_steps)
    return r.lr * (r.min_lr_ratio + (1 - r.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_target(out_dir: Path, work_dir: Path, recipe: TargetRecipe, log=print) -> dict:
    """Trains tokenizer and target into `out_dir`; `work_dir` keeps caches and a resumable checkpoint."""
    from tqdm import tqdm
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    tok_dir = work_dir / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        log("training tokenizer ...")
        train_tokenizer(tok_dir, recipe.vocab_size)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    train = encode_split(tok_dir, "train", work_dir / "train.npy")
    held = encode_split(tok_dir, "held_out", work_dir / "held_out.npy")
    log(f"corpus: {len(train):,} train tokens, {len(held):,} held-out tokens")

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.1, betas=(0.9, 0.95))
    rng = np.random.default_rng(recipe.seed)
    eval_rng = np.random.default_rng(recipe.seed + 1)
    eval_starts = [eval_rng.integers(0, len(held) - recipe.seq_len - 1, recipe.batch_size)
                   for _ in range(recipe.eval_batches)]
    history: list[dict] = []
    start_step = 0
    ckpt = work_dir / "target_ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        history, start_step = state["history"], state["step"]
        log(f"resuming target training at step {start_step}")

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            losses = [model(input_ids=_batch(held, s, recipe.seq_len)[:, :-1],
                            labels=_batch(held, s, recipe.seq_len)[:, :-1]).loss.item()
                      for s in eval_starts]
        model.train()
        return float(np.mean(losses))

    t0 = time.time()
    bar = tqdm(range(start_step, recipe.steps), initial=start_step, total=recipe.steps, desc="target")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, recipe)
        starts = rng.integers(0, len(train) - recipe.seq_len - 1, recipe.batch_size)
        batch = _batch(train, starts, recipe.seq_len)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % recipe.eval_every == 0 or step + 1 == recipe.steps:
            entry = {"step": step + 1, "train_loss": loss.item(), "held_out_loss": held_out_loss(),
                     "minutes": (time.time() - t0) / 60}
            history.append(entry)
            log(json.dumps(entry))
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state,
                        "history": history, "step": step + 1}, ckpt)

    model = model.to(torch.float16)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    report = {"recipe": asdict(recipe), "parameters": sum(p.numel() for p in model.parameters()),
              "history": history, "final_held_out_loss": history[-1]["held_out_loss"]}
    (out_dir / "training_report.json").write_text(json.dumps(report, indent=1))
    return report
