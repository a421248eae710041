"""The target's states over the self-distilled conversations, captured once and cached on disk.

For every conversation (prompt + the target's response) one target forward records, per token, the
auxiliary hidden states the head reads ([3*Ht], float16) and the final normed state ([Ht], float16),
from which the trainer recomputes the target's logits over the draft vocabulary (one small matmul)
instead of storing [V] logits per token. Conversations are captured in chunks of files written
atomically, so a killed capture resumes at the first missing chunk; every head trained on the same
data and auxiliary layers reads the same cache. The forward runs in float32, or under bfloat16 autocast (much
faster on CPUs with bfloat16 matmuls; its final states give the float32 argmax at ~99% of tokens), one
precision per cache.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

CHUNK = 256  # conversations per cache chunk
CAPTURE_PRECISIONS = ("float32", "bfloat16")


def cache_dir_for(data_dir: Path, aux_layer_ids: list[int]) -> Path:
    return Path(data_dir) / ("capture-" + "-".join(str(i) for i in aux_layer_ids))


@torch.no_grad()
def capture_states(target, ids: torch.Tensor, aux_layer_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] -> (auxiliary states [B, T, 3*Ht]: hidden state after layer i, before the final norm, as
    vLLM exposes them; final normed state [B, T, Ht]: what the target's lm_head reads)."""
    num_layers = target.config.num_hidden_layers
    if any(not 0 <= i < num_layers for i in aux_layer_ids):
        raise ValueError(f"aux layer ids {aux_layer_ids} must lie in 0..{num_layers - 1} (ids equal to the "
                         "layer count would read the final-normed state, which vLLM does not expose)")
    out = target.model(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in aux_layer_ids], dim=-1)
    return aux, out.last_hidden_state


def capture_conversations(target_dir: str, rows: list[dict], cache: Path, aux_layer_ids: list[int],
                          batch_tokens: int = 4096, precision: str | None = None, device: str = "cpu",
                          log=print) -> Path:
    """Captures `rows` ({"prompt_ids", "response_ids"}) into `cache` chunk by chunk; returns `cache`.
    `precision` ("float32" or "bfloat16"; None: the cache's own, float32 for a new one) is the forward's;
    `device` runs it (the cache is the same wherever it was made)."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    cache.mkdir(parents=True, exist_ok=True)
    meta_path = cache / "meta.json"
    before = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if before and before.get("aux_layer_ids") != aux_layer_ids:
        raise ValueError(f"{cache} holds states of other auxiliary layers: remove it or pass the same --aux-layers")
    held = before.get("precision", "float32") if before else None
    if precision and held and precision != held:
        raise ValueError(f"{cache} holds states captured in {held}, {precision} was asked for: remove it or capture "
                         f"in {held}")
    precision = precision or held or "float32"
    if precision not in CAPTURE_PRECISIONS:
        raise ValueError(f"capture precision is {precision!r}: choose one of {', '.join(CAPTURE_PRECISIONS)}")
    meta = {"aux_layer_ids": aux_layer_ids, "conversations": len(rows), "chunk": CHUNK, "precision": precision}
    meta_path.write_text(json.dumps(meta))
    todo = [c for c in range(0, len(rows), CHUNK) if not (cache / f"chunk-{c // CHUNK:04d}").is_dir()]
    if not todo:
        return cache
    dev = torch.device(device)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(dev).eval()
    total = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    done = total - sum(len(r["prompt_ids"]) + len(r["response_ids"]) for c in todo for r in rows[c:c + CHUNK])
    t0 = time.time()
    with tqdm(total=total, initial=done, desc="capture target states", unit="tok", unit_scale=True) as bar:
        for start in todo:
            chunk = rows[start:start + CHUNK]
            seqs = [r["prompt_ids"] + r["response_ids"] for r in chunk]
            aux_out: list[np.ndarray | None] = [None] * len(seqs)
            final_out: list[np.ndarray | None] = [None] * len(seqs)
            order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
            i = 0
            while i < len(order):  # batches of similar lengths, right-padded (causal: padding changes nothing before it)
                longest, j = len(seqs[order[i]]), i
                while j < len(order) and (j - i + 1) * len(seqs[order[j]]) <= batch_tokens:
                    longest, j = len(seqs[order[j]]), j + 1
                j = max(j, i + 1)
                batch = order[i:j]
                ids = torch.zeros(len(batch), longest, dtype=torch.long)
                for row, s in enumerate(batch):
                    ids[row, :len(seqs[s])] = torch.tensor(seqs[s])
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                    aux, final = capture_states(target, ids.to(dev), aux_layer_ids)
                aux, final = aux.to(torch.float16).cpu(), final.to(torch.float16).cpu()
                for row, s in enumerate(batch):
                    n = len(seqs[s])
                    aux_out[s] = aux[row, :n].numpy()
                    final_out[s] = final[row, :n].numpy()
                    bar.update(n)
                i = j
            lengths = np.array([len(s) for s in seqs], dtype=np.int64)
            arrays = {"tokens": np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs]),
                      "offsets": np.concatenate([[0], np.cumsum(lengths)]),
                      "response_start": np.array([len(r["prompt_ids"]) for r in chunk], dtype=np.int64),
                      "aux": np.concatenate(aux_out), "final": np.concatenate(final_out)}
            _write_chunk(cache / f"chunk-{start // CHUNK:04d}", arrays)
    log(f"captured {total:,} tokens of {len(rows):,} conversations into {cache} ({time.time() - t0:.0f} s)")
    return cache


def _write_chunk(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """One .npy file per array (memory-mapped when read), in a directory renamed into place when whole."""
    import shutil

    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, value in arrays.items():
        np.save(tmp / f"{name}.npy", value)
    tmp.replace(path)


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] token ids, right-padded with 0
    aux: torch.Tensor  # [B, T, 3*Ht] auxiliary target states
    final: torch.Tensor  # [B, T, Ht] final normed target states (target logits = final @ lm_head.T)
    loss_mask: torch.Tensor  # [B, T] bool: the target's distribution at t is a training label (t in the response)


class CapturedConversations:
    """Batches of whole conversations from a capture cache, lengths grouped to waste little padding.

    An epoch is a permutation of all conversations drawn from (seed, epoch); batch b of an epoch is
    then the same for every run with the same seed and batch size, so heads trained for equal steps
    see exactly the same data, and a resumed run continues with the batch it would have drawn.
    The cache is memory-mapped, or with `preload` (default: on an accelerator) loaded whole onto `device`, so a
    batch is gathered where it is used instead of copied from the host at every step.
    """

    def __init__(self, cache: Path, batch_size: int, seed: int = 0, max_len: int | None = None,
                 device: str = "cpu", preload: bool | None = None) -> None:
        dirs = [d for d in sorted(Path(cache).glob("chunk-*")) if d.is_dir() and not d.name.endswith(".tmp")]
        if not dirs:
            raise FileNotFoundError(f"{cache} holds no captured chunk: capture the data first")
        self.device = torch.device(device)
        self._arrays = [{k: np.load(d / f"{k}.npy", mmap_mode="r") for k in ("tokens", "aux", "final")} for d in dirs]
        if preload is None:
            preload = self.device.type != "cpu"
        if preload:
            self._arrays = [{k: torch.from_numpy(np.array(a)).to(self.device) for k, a in arrays.items()}
                            for arrays in self._arrays]
        self.index: list[tuple[int, int, int, int]] = []  # (chunk, start, length, response start)
        for c, d in enumerate(dirs):
            offsets, response = np.load(d / "offsets.npy"), np.load(d / "response_start.npy")
            for s in range(len(response)):
                length = int(offsets[s + 1] - offsets[s])
                if max_len:
                    length = min(length, max_len)
                if length > int(response[s]) + 1:
                    self.index.append((c, int(offsets[s]), length, int(response[s])))
        self.batch_size, self.seed = batch_size, seed

    @property
    def batches_per_epoch(self) -> int:
        return len(self.index) // self.batch_size

    @property
    def response_tokens(self) -> int:
        return sum(length - response for _, _, length, response in self.index)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        perm = rng.permutation(len(self.index))
        group = 32 * self.batch_size  # sort within groups by length, then shuffle the batches
        batches = []
        for g in range(0, len(perm) - self.batch_size + 1, group):
            part = sorted(perm[g:g + group], key=lambda i: self.index[i][2])
            batches += [part[b:b + self.batch_size] for b in range(0, len(part) - self.batch_size + 1, self.batch_size)]
        order = rng.permutation(len(batches))
        return [batches[i] for i in order]

    def _rows(self, chunk: int, key: str, start: int, length: int) -> torch.Tensor:
        """Rows [start, start + length) of one chunk's array `key` ([N] tokens or [N, D] states), as stored."""
        part = self._arrays[chunk][key][start:start + length]
        return part if isinstance(part, torch.Tensor) else torch.from_numpy(np.array(part))

    def batch(self, step: int) -> Batch:
        """The batch of global step `step` (0-based), epochs following each other."""
        per_epoch = self.batches_per_epoch
        members = self._epoch_batches(step // per_epoch)[step % per_epoch]
        longest = max(self.index[i][2] for i in members)
        ht = self._arrays[0]["final"].shape[1]
        dev = self.device
        ids = torch.zeros(len(members), longest, dtype=torch.long, device=dev)
        aux = torch.zeros(len(members), longest, self._arrays[0]["aux"].shape[1], device=dev)
        final = torch.zeros(len(members), longest, ht, device=dev)
        mask = torch.zeros(len(members), longest, dtype=torch.bool, device=dev)
        for row, i in enumerate(members):
            c, start, length, response = self.index[i]
            ids[row, :length] = self._rows(c, "tokens", start, length)
            aux[row, :length] = self._rows(c, "aux", start, length)
            final[row, :length] = self._rows(c, "final", start, length)
            mask[row, response - 1:length - 1] = True  # the distribution at t predicts token t+1 of the response
        return Batch(ids, aux, final, mask)
