"""The P-EAGLE head trainer: the target's states, all K depths laid out with COD sampling, one head
forward per batch, KL over the draft vocabulary; progress bar, JSON log (tokens seen, wall time), loss
PNG, resumable checkpoints, export in the speculators format.

A finished run continues with `--resume` and a larger step count: the added steps form a new stage with its
own warmup and cosine decay (and the stage's own precision and data); the log lists the stages. `--init-from`
starts a new run from a finished head's weights (its train_log.json's steps and stages continue) with a fresh
optimizer: the way to add a stage once the trainer's state is gone, or to fine-tune a published head.

Two data routes: token windows of plain text, the target run inside each step (small targets); or the
target's own conversations (`peagle-vllm distill`), whose states are captured once into a cache that
every head trained on them shares, with the loss on the response tokens only (real targets).

`--out DIR` becomes the head (config.json, model.safetensors, train_log.json, loss.png); the trainer's
own state lives in DIR/trainer/ until the run ends.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from peagle_vllm.checkpoint import save_head
from peagle_vllm.head import HeadConfig, PEagleHead
from peagle_vllm.train.capture import CapturedConversations, cache_dir_for, capture_conversations
from peagle_vllm.train.data import (WindowSampler, capture, is_conversation_dir, load_token_stream,
                                    read_conversations, self_distill)
from peagle_vllm.train.layout import SlotLayout, build_layout
from peagle_vllm.train.objective import DEPTH_DECAY, draft_vocabulary, step_loss

STATE_DIR = "trainer"  # inside --out: the resumable state, removed when the run ends
STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.json"
# HeadConfig fields a continued head need not share: its draft temperature is calibrated after training, so the new
# run's head starts uncalibrated (1.0) and is calibrated again.
NOT_LAYOUT = ("extra", "draft_temperature")
MAX_SKIPPED = 8  # steps in a row whose loss or gradient is not finite before a run stops as diverged


@dataclass
class TrainRecipe:
    target: str
    data: str
    out: str
    k: int = 8
    variant: str = "depth"
    steps: int = 300
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 20
    cod_rate: float = 0.7
    cod_min: float = 0.2
    draft_vocab: int = 2048
    aux_layer_ids: list[int] = field(default_factory=list)
    self_distill: bool = True
    distill_temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])  # pool split among them
    distill_pool: int = 2048  # sequences the target generates once, before training
    prompt_len: int = 32
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 50
    mask_token_id: int | None = None  # None: the tokenizer's mask token, else its unk, pad or eos token
    share_embeddings: bool = False  # keep the target's embeddings frozen and leave them out of the export
    precision: str = "float32"  # "bfloat16": the forward under autocast (weights, optimizer and loss stay float32)
    depth_decay: float = DEPTH_DECAY  # depth d's loss weighs depth_decay**d (step_loss)


PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}


def stage_lr(stage: dict, warmup: int, step: int) -> float:
    """Warmup then cosine decay to zero within `stage` ({"start", "end", "lr"}) for 0-based `step`."""
    into, length = step - stage["start"], stage["end"] - stage["start"]
    return stage["lr"] * min(1.0, (into + 1) / warmup) * 0.5 * (1 + np.cos(np.pi * into / length))


def next_stages(stages: list[dict], done: int, recipe: TrainRecipe) -> list[dict]:
    """The run's stages once it is asked for `recipe.steps` with `done` steps behind it: unchanged while
    the last stage is unfinished, a new stage [done, steps) when the last one has ended."""
    if recipe.precision not in PRECISIONS:
        raise ValueError(f"precision is {recipe.precision!r}: choose one of {', '.join(PRECISIONS)}")
    if not 0 < recipe.depth_decay <= 1:
        raise ValueError(f"depth_decay is {recipe.depth_decay}: pass a number in (0, 1]")
    if recipe.steps < done:
        raise ValueError(f"--steps {recipe.steps} is below the {done} steps this run has done: pass at least {done}")
    if stages and done < stages[-1]["end"]:
        if recipe.steps != stages[-1]["end"]:
            raise ValueError(f"this run's stage ends at step {stages[-1]['end']}: resume with --steps "
                             f"{stages[-1]['end']}, then continue past it")
        return stages
    if recipe.steps == done:
        return stages
    return [*stages, {"start": done, "end": recipe.steps, "precision": recipe.precision, "lr": recipe.lr,
                      "batch_size": recipe.batch_size, "data": Path(recipe.data).name, "device": recipe.device,
                      "depth_decay": recipe.depth_decay}]


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's (2, L/2, L-3), made distinct and < L for shallow targets."""
    ids = sorted({min(max(i, 1), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)})
    candidates = [i for i in range(1, num_layers) if i not in ids]
    while len(ids) < 3 and candidates:
        ids = sorted(ids + [candidates.pop()])
    return ids


def resolve_mask_token_id(tokenizer, explicit: int | None) -> int:
    """The id mask slots are fed: `explicit`, else the tokenizer's mask token, else its unk, pad or eos
    token (a real target has no mask token, and adding one would change its vocabulary; unk comes first
    because chat text never contains it)."""
    if explicit is not None:
        if not 0 <= explicit < len(tokenizer):
            raise ValueError(f"--mask-token-id {explicit} is outside the tokenizer's {len(tokenizer)} tokens")
        return explicit
    for name in ("mask_token_id", "unk_token_id", "pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("the tokenizer has no mask, unk, pad or eos token: pass --mask-token-id")


def _head_config(recipe: TrainRecipe, target, mask_token_id: int | None, aux: list[int]) -> HeadConfig:
    tc = target.config
    depth = recipe.variant == "depth"
    return HeadConfig(hidden_size=tc.hidden_size, vocab_size=tc.vocab_size,
                      draft_vocab_size=min(recipe.draft_vocab, tc.vocab_size),
                      intermediate_size=tc.intermediate_size, num_attention_heads=tc.num_attention_heads,
                      num_key_value_heads=tc.num_key_value_heads, head_dim=getattr(tc, "head_dim", None),
                      aux_layer_ids=aux, mask_token_id=mask_token_id, rms_norm_eps=tc.rms_norm_eps,
                      max_position_embeddings=tc.max_position_embeddings,
                      rope_theta=float((getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
                      variant=recipe.variant, trained_depth=recipe.k, fc_norm=depth, norm_output=depth)


class WindowBatches:
    """Token windows of plain text (or of the target's continuations of them); the target runs inside
    each step and every position is a label."""

    def __init__(self, target, recipe: TrainRecipe, stream, rng: np.random.Generator, vocab: torch.Tensor,
                 state_dir: Path, log) -> None:
        window = recipe.seq_len if not recipe.self_distill else recipe.prompt_len
        self.sampler = WindowSampler(stream, window, rng)
        self.pool = distill_pool(target, self.sampler, recipe, state_dir / "distill_pool.pt", log) \
            if recipe.self_distill else None
        self.target, self.recipe, self.rng, self.vocab = target, recipe, rng, vocab

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(ids [B, T], aux [B, T, 3*Ht], logits over the draft vocabulary [B, T, Vd], loss mask or None)."""
        dev = self.vocab.device
        if self.pool is not None:
            ids = self.pool[torch.from_numpy(self.rng.integers(0, len(self.pool), self.recipe.batch_size))].to(dev)
        else:
            ids = self.sampler.batch(self.recipe.batch_size).to(dev)
        aux, logits = capture(self.target, ids, self.recipe.aux_layer_ids)
        return ids, aux, logits[..., self.vocab], None


class ConversationBatches:
    """The target's own conversations, captured once (`train.capture`); labels on the response only."""

    def __init__(self, captured: CapturedConversations, lm_head: torch.Tensor, vocab: torch.Tensor) -> None:
        self.captured = captured
        self.lm_head = lm_head[vocab].float()  # [Vd, Ht]: the target's output rows of the draft vocabulary

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        b = self.captured.batch(step)
        dev = self.lm_head.device
        return b.ids.to(dev), b.aux.to(dev), b.final.to(dev) @ self.lm_head.T, b.loss_mask.to(dev)


def distill_pool(target, sampler: WindowSampler, recipe: TrainRecipe, cache: Path, log) -> torch.Tensor:
    """[N, seq_len+1] prompts continued by the target itself (split among `distill_temperatures`),
    generated once in large batches (cheap per token) and cached next to the run for --resume."""
    if cache.exists():
        return torch.load(cache)
    from tqdm import tqdm

    new = recipe.seq_len - recipe.prompt_len  # windows hold prompt_len + 1 tokens
    chunks, per_t = [], recipe.distill_pool // len(recipe.distill_temperatures)
    with tqdm(total=per_t * len(recipe.distill_temperatures), desc="self-distillation") as bar:
        for t in recipe.distill_temperatures:
            for start in range(0, per_t, 64):
                n = min(64, per_t - start)
                chunks.append(self_distill(target, sampler.batch(n).to(target.device), new, t).cpu())
                bar.update(n)
    pool = torch.cat(chunks)
    torch.save(pool, cache)
    log(f"self-distillation pool: {tuple(pool.shape)}")
    return pool


def _plot(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([h["step"] for h in history], [h["loss"] for h in history])
    a.set_xlabel("step"), a.set_ylabel("KL(target || draft)"), a.set_title("loss")
    last = history[-1]["accuracy"]
    b.bar([int(d) + 1 for d in last], list(last.values()))
    b.set_xlabel("draft position"), b.set_ylabel("top-1 agreement"), b.set_title(f"step {history[-1]['step']}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _initial_head(path: str, cfg: HeadConfig, embeddings: torch.Tensor) -> tuple[PEagleHead, list[dict], list[dict]]:
    """The head at `path` in float32 with its history and stages (empty for a head without a train_log.json);
    refused unless its shape and layout equal `cfg`, the run's own (its calibration may differ: NOT_LAYOUT)."""
    from peagle_vllm.checkpoint import load_head

    base = load_head(path, target_embeddings=embeddings)
    theirs, ours = asdict(base.cfg), asdict(cfg)
    differ = [k for k in ours if k not in NOT_LAYOUT and theirs[k] != ours[k]]
    if differ:
        raise ValueError(f"--init-from {path}: its " + ", ".join(f"{k} is {theirs[k]} (this run: {ours[k]})" for k in differ)
                         + ": pass the --k, --variant, --draft-vocab and --aux-layers it was trained with")
    log_path = Path(path) / LOG_FILE
    run = json.loads(log_path.read_text()) if log_path.exists() else {"history": [], "stages": []}
    return base, run["history"], run["stages"]


@torch.no_grad()
def _initialise(head: PEagleHead, target, vocab: torch.Tensor) -> None:
    """A new head: the target's embeddings and output rows of the draft vocabulary `vocab` [Vd], and fc
    reading the deepest auxiliary state as is (the target's own output layer then reads it)."""
    head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocab])
    head.set_vocab_map(vocab)
    if head.cfg.target_hidden_size == head.cfg.hidden_size:
        h = head.cfg.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, -h:] = torch.eye(h)


def train(recipe: TrainRecipe, resume: bool = False, init_from: str | None = None, log=print) -> dict:
    """Trains a head into `recipe.out`; returns the final log entry. Refuses to overwrite an existing
    head unless resuming. `init_from`: a finished head to start from (fresh optimizer; its draft vocabulary
    kept), for a new run only."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(recipe.out)
    state_dir = out / STATE_DIR
    state_path = state_dir / STATE_FILE
    if init_from and resume:
        raise ValueError("--init-from starts a new run: drop --resume (or drop --init-from to continue OUT's run)")
    if out.exists() and any(out.iterdir()) and not (resume and state_dir.is_dir()):
        raise FileExistsError(f"{out} is not empty: pass --resume to continue its training, or choose another --out")
    state_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    dev = torch.device(recipe.device)
    tokenizer = AutoTokenizer.from_pretrained(recipe.target)
    mask_id = None if recipe.variant == "eagle3" else resolve_mask_token_id(tokenizer, recipe.mask_token_id)
    target = AutoModelForCausalLM.from_pretrained(recipe.target, dtype=torch.float32).to(dev).eval()
    aux = recipe.aux_layer_ids or default_aux_layers(target.config.num_hidden_layers)
    recipe.aux_layer_ids = aux
    rng = np.random.default_rng(recipe.seed)
    conversations = is_conversation_dir(recipe.data)
    if conversations:
        rows = read_conversations(recipe.data)
        token_ids = torch.tensor([t for r in rows for t in r["response_ids"]])
    else:
        stream = load_token_stream(tokenizer, recipe.data)
        token_ids = torch.from_numpy(stream)
    head = PEagleHead(_head_config(recipe, target, mask_id, aux)).to(dev)
    history: list[dict] = []
    stages: list[dict] = []
    start, elapsed = 0, 0.0
    if init_from:
        base, history, stages = _initial_head(init_from, head.cfg, target.get_input_embeddings().weight.detach())
        head.load_state_dict(base.state_dict())
        start, elapsed = (history[-1]["step"], history[-1]["seconds"]) if history else (0, 0.0)
        log(f"starting from {init_from} at step {start} (fresh optimizer)")
    else:
        counts = torch.bincount(token_ids, minlength=target.config.vocab_size)
        vocab = draft_vocabulary(counts, recipe.draft_vocab, always=[tokenizer.eos_token_id]).to(dev)
        _initialise(head, target, vocab)
    head.embed_tokens.weight.requires_grad_(not recipe.share_embeddings)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=recipe.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(recipe.seed)  # COD sampling
    if resume and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        gen.set_state(state["cod_rng"])
        history, start, stages = state["history"], state["step"], state["stages"]
        elapsed = history[-1]["seconds"] if history else 0.0
        log(f"resuming at step {start}")
    vocab = head.draft_to_target()  # labels over the head's own draft vocabulary, however the head was made
    stages = next_stages(stages, start, recipe)
    if conversations:
        cache = capture_conversations(recipe.target, rows, cache_dir_for(Path(recipe.data), aux), aux,
                                      device=recipe.device, log=log)
        del rows
        source = ConversationBatches(CapturedConversations(cache, recipe.batch_size, recipe.seed, recipe.seq_len,
                                                           device=recipe.device),
                                     target.get_output_embeddings().weight.detach(), vocab)
        del target  # its states are cached; only the output rows of the draft vocabulary are kept
    else:
        source = WindowBatches(target, recipe, stream, rng, vocab, state_dir, log)
    tokens = history[-1].get("tokens", 0) if history else 0
    bar = tqdm(range(start, recipe.steps), initial=start, total=recipe.steps, desc=f"train {recipe.variant} K={recipe.k}")
    t0 = time.time() - elapsed
    skipped = 0
    for step in bar:
        stage = stages[-1]
        lr = stage_lr(stage, recipe.warmup, step)
        for g in opt.param_groups:
            g["lr"] = lr
        ids, aux_states, logits, loss_mask = source.batch(step)
        layout = build_layout(ids.shape[1], 1 if recipe.variant == "eagle3" else recipe.k, recipe.cod_rate,
                              recipe.cod_min, generator=gen)
        layout = SlotLayout(layout.anchor.to(dev), layout.depth.to(dev), layout.attend.to(dev))
        autocast = PRECISIONS[stage["precision"]]
        with torch.autocast(dev.type, dtype=autocast, enabled=autocast is not None):
            loss, accuracy = step_loss(head, layout, ids, aux_states, logits, loss_mask,
                                       stage.get("depth_decay", DEPTH_DECAY))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        finite = bool(torch.isfinite(loss) and torch.isfinite(grad_norm))
        if finite:  # a non-finite step is skipped: one bad batch must not turn every weight into NaN
            opt.step()
            tokens += int(loss_mask.sum()) if loss_mask is not None else ids.numel()
            skipped = 0
        else:
            skipped += 1
            bad = [n for n, q in head.named_parameters() if q.grad is not None and not torch.isfinite(q.grad).all()]
            log(f"step {step + 1}: loss {loss.item()}, gradient norm {grad_norm.item()}, non-finite gradients in "
                f"{', '.join(bad[:4]) or 'none'}{' ...' if len(bad) > 4 else ''}: skipped")
            if skipped == MAX_SKIPPED:
                raise FloatingPointError(
                    f"training diverged: {MAX_SKIPPED} steps in a row to step {step + 1} had a loss or gradient that "
                    "is not finite (the head's weights stayed finite): train again with a lower --lr (--init-from a "
                    "finished head keeps its earlier stages)")
        bar.set_postfix(loss=f"{loss.item():.3f}", acc1=f"{accuracy.get(0, 0):.2f}",
                        accK=f"{accuracy.get(recipe.k - 1, 0):.2f}")
        entry = {"step": step + 1, "loss": loss.item(), "lr": lr, "accuracy": accuracy, "tokens": tokens,
                 "seconds": round(time.time() - t0, 2), **({} if finite else {"skipped": True})}
        history.append(entry)
        if (step + 1) % recipe.checkpoint_every == 0 or step + 1 == recipe.steps:
            tmp = state_path.with_suffix(".tmp")
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state,
                        "torch_rng": torch.get_rng_state(), "cod_rng": gen.get_state(), "history": history,
                        "stages": stages, "step": step + 1}, tmp)
            tmp.replace(state_path)
    save_head(head.cpu(), out, verifier=Path(recipe.target).name, share_embeddings=recipe.share_embeddings)
    (out / LOG_FILE).write_text(json.dumps({"recipe": {**asdict(recipe), "target": Path(recipe.target).name,
                                                       "data": Path(recipe.data).name, "out": out.name},
                                            "stages": stages, "history": history}, indent=1))
    _plot(history, out / "loss.png")
    return history[-1]
