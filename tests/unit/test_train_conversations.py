"""The trainer's conversation route on the tiny target: states captured once into a cache shared by every
head, batches of whole conversations with labels on the response only, resume, and the export vLLM loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from peagle_vllm.checkpoint import load_head, read_tensors
from peagle_vllm.train.capture import CapturedConversations, cache_dir_for, capture_conversations, capture_states


def _conversations(root: Path, tiny_target: Path, count: int = 24) -> Path:
    """A distillation directory as `peagle-vllm distill` writes it (token ids only), two chunks."""
    from transformers import AutoTokenizer

    from tiny_models import TEXT

    tok = AutoTokenizer.from_pretrained(tiny_target)
    ids = tok(TEXT)["input_ids"]
    rng = np.random.default_rng(0)
    data = root / "distill"
    data.mkdir()
    rows = []
    for i in range(count):
        start, p, r = int(rng.integers(0, len(ids) - 80)), int(rng.integers(4, 12)), int(rng.integers(8, 40))
        rows.append({"prompt": f"p{i}", "temperature": 0.0, "prompt_ids": ids[start:start + p],
                     "response_ids": ids[start + p:start + p + r], "finished": True})
    for c in range(2):
        part = rows[c * count // 2:(c + 1) * count // 2]
        (data / f"chunk-{c:04d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return data


def test_captured_states_equal_a_direct_target_forward_and_labels_cover_responses(tiny, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from peagle_vllm.train.data import read_conversations

    data = _conversations(tmp_path, tiny["target"])
    rows = read_conversations(data)
    cache = capture_conversations(str(tiny["target"]), rows, cache_dir_for(data, [1, 2, 3]), [1, 2, 3])
    again = capture_conversations(str(tiny["target"]), rows, cache, [1, 2, 3])  # cached: nothing recomputed
    assert again == cache
    source = CapturedConversations(cache, batch_size=4, seed=0)
    assert source.batches_per_epoch == len(rows) // 4
    assert source.response_tokens == sum(len(r["response_ids"]) for r in rows)
    batch = source.batch(0)
    target = AutoModelForCausalLM.from_pretrained(tiny["target"]).eval()
    by_prompt = {tuple(r["prompt_ids"] + r["response_ids"]): r for r in rows}
    for row in range(batch.ids.shape[0]):
        length = int((batch.ids[row] != 0).nonzero().max()) + 1
        seq = batch.ids[row, :length]
        conv = by_prompt[tuple(seq.tolist())]
        aux, final = capture_states(target, seq[None], [1, 2, 3])
        assert torch.allclose(batch.aux[row, :length], aux[0], atol=2e-2, rtol=1e-2)  # stored as float16
        assert torch.allclose(batch.final[row, :length], final[0], atol=2e-2, rtol=1e-2)
        labels = batch.loss_mask[row].nonzero().flatten()
        # the distribution at t predicts token t+1: labels from the last prompt position to the one before the end
        assert labels.tolist() == list(range(len(conv["prompt_ids"]) - 1, length - 1))


def test_epochs_are_permutations_and_the_same_for_every_run_with_the_seed(tiny, tmp_path: Path) -> None:
    from peagle_vllm.train.data import read_conversations

    data = _conversations(tmp_path, tiny["target"])
    cache = capture_conversations(str(tiny["target"]), read_conversations(data), cache_dir_for(data, [1, 2, 3]),
                                  [1, 2, 3])
    a, b = CapturedConversations(cache, 4, seed=3), CapturedConversations(cache, 4, seed=3)
    seen = [i for batch in a._epoch_batches(0) for i in batch]
    assert sorted(seen) == list(range(len(a.index)))  # every conversation once per epoch
    assert all(torch.equal(a.batch(s).ids, b.batch(s).ids) for s in range(8))
    assert not torch.equal(a.batch(0).ids, CapturedConversations(cache, 4, seed=4).batch(0).ids)
    loaded = CapturedConversations(cache, 4, seed=3, preload=True)  # as on a GPU: the cache in memory, not mapped
    assert isinstance(loaded._arrays[0]["aux"], torch.Tensor) and not isinstance(a._arrays[0]["aux"], torch.Tensor)
    for s in range(4):
        x, y = a.batch(s), loaded.batch(s)
        assert all(torch.equal(getattr(x, f), getattr(y, f)) for f in ("ids", "aux", "final", "loss_mask"))


def test_heads_trained_on_conversations_share_the_cache_and_load_with_the_targets_embeddings(tiny, tmp_path: Path,
                                                                                             capsys) -> None:
    from peagle_vllm.train.trainer import STATE_DIR, TrainRecipe, train

    data = _conversations(tmp_path, tiny["target"])
    torch.set_num_threads(1)
    logs = {}
    for variant in ("depth", "standard"):
        out = tmp_path / variant
        recipe = TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(out), k=4, variant=variant, steps=6,
                             batch_size=4, seq_len=64, draft_vocab=256, share_embeddings=True, checkpoint_every=3)
        train(recipe)
        logs[variant] = json.loads((out / "train_log.json").read_text())["history"]
        assert (out / STATE_DIR).is_dir() and (out / "loss.png").is_file()
        assert "embed_tokens.weight" not in read_tensors(out)  # the target's embeddings are shared, not shipped
        assert "/" not in json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    assert capsys.readouterr().out.count("captured ") == 1  # the second head read the first one's cache
    # equal budgets: the same batches, hence the same labelled tokens step by step
    assert [h["tokens"] for h in logs["depth"]] == [h["tokens"] for h in logs["standard"]]
    assert logs["depth"][-1]["tokens"] > 0 and logs["depth"][-1]["seconds"] > 0
    from transformers import AutoModelForCausalLM

    embeddings = AutoModelForCausalLM.from_pretrained(tiny["target"]).get_input_embeddings().weight
    head = load_head(tmp_path / "depth", target_embeddings=embeddings)
    assert torch.equal(head.embed_tokens.weight, embeddings)


def test_a_bfloat16_capture_is_close_to_float32_and_a_cache_keeps_one_precision(tiny, tmp_path: Path) -> None:
    from peagle_vllm.train.data import read_conversations

    data = _conversations(tmp_path, tiny["target"], count=8)
    rows = read_conversations(data)
    exact = capture_conversations(str(tiny["target"]), rows, tmp_path / "f32", [1, 2, 3])
    fast = capture_conversations(str(tiny["target"]), rows, tmp_path / "bf16", [1, 2, 3], precision="bfloat16")
    a, b = CapturedConversations(exact, 4).batch(0), CapturedConversations(fast, 4).batch(0)
    assert torch.equal(a.ids, b.ids)
    assert not torch.equal(a.final, b.final)  # the forward did run in bfloat16
    for x, y in ((a.aux, b.aux), (a.final, b.final)):
        assert ((x - y).norm() / x.norm()) < 0.05  # bfloat16 keeps 8 bits of mantissa
    with pytest.raises(ValueError, match="captured in bfloat16, float32 was asked for"):
        capture_conversations(str(tiny["target"]), rows, fast, [1, 2, 3], precision="float32")
    assert capture_conversations(str(tiny["target"]), rows, fast, [1, 2, 3]) == fast  # None: the cache's own


def test_a_run_resumed_on_a_new_data_set_keeps_its_heads_draft_vocabulary(tiny, tmp_path: Path, monkeypatch) -> None:
    """A stage over another data set continues OUT's run: its labels must be the target's logits over the head's
    own draft vocabulary, not over one counted from the new data (that would permute every label)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from peagle_vllm.train import trainer
    from peagle_vllm.train.data import read_conversations

    first = _conversations(tmp_path, tiny["target"])
    second = tmp_path / "b"
    second.mkdir()
    for chunk in first.glob("chunk-*.jsonl"):  # other token counts: the responses reversed and cut short
        rows = [json.loads(line) for line in chunk.read_text().splitlines()]
        rows = [{**r, "response_ids": r["response_ids"][::-1][:6]} for r in rows]
        (second / chunk.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = []
    real = trainer.ConversationBatches

    def spy(captured, lm_head, vocab):
        seen.append(vocab.clone())
        return real(captured, lm_head, vocab)

    monkeypatch.setattr(trainer, "ConversationBatches", spy)
    torch.set_num_threads(1)
    out = tmp_path / "head"

    def recipe(data: Path, steps: int):
        return trainer.TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(out), k=4, variant="depth",
                                   steps=steps, batch_size=4, seq_len=64, draft_vocab=64, share_embeddings=True,
                                   checkpoint_every=3)

    trainer.train(recipe(first, 3))
    trainer.train(recipe(second, 6), resume=True)
    target = AutoModelForCausalLM.from_pretrained(tiny["target"])
    counts = torch.bincount(torch.tensor([t for r in read_conversations(second) for t in r["response_ids"]]),
                            minlength=target.config.vocab_size)
    own = trainer.draft_vocabulary(counts, 64, always=[AutoTokenizer.from_pretrained(tiny["target"]).eos_token_id])
    assert not torch.equal(own, seen[0])  # the second data set alone would pick another vocabulary
    assert len(seen) == 2 and torch.equal(seen[1], seen[0])
    head = load_head(out, target_embeddings=target.get_input_embeddings().weight)
    assert torch.equal(head.draft_to_target(), seen[0])
