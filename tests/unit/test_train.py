"""Trainer pieces on tensors (COD counts, attention mask, loss) and a short real training run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from peagle_vllm.train.layout import build_layout, keep_fraction
from peagle_vllm.train.objective import kl_to_target


def test_cod_keeps_the_right_fraction_per_depth_and_nests() -> None:
    t, k = 2001, 8
    layout = build_layout(t, k, r=0.7, r_min=0.2, generator=torch.Generator().manual_seed(0))
    anchors = {d: set(layout.anchor[layout.depth == d].tolist()) for d in range(k)}
    assert len(anchors[0]) == t - 1
    for d in range(1, k):
        eligible = t - 1 - d
        assert abs(len(anchors[d]) / eligible - keep_fraction(d, 0.7, 0.2)) < 0.05
        assert anchors[d] <= anchors[d - 1]  # a kept slot has all shallower slots of its anchor


def test_attention_sees_context_and_earlier_depths_of_own_anchor_only() -> None:
    layout = build_layout(12, 4, r=1.0, r_min=1.0)
    slot = {(a, d): i for i, (a, d) in enumerate(zip(layout.anchor.tolist(), layout.depth.tolist()))}
    for (a, d), q in slot.items():
        for (a2, d2), key in slot.items():
            expected = (d2 == 0 and a2 <= a) or (d > 0 and d2 > 0 and a2 == a and d2 <= d)
            assert bool(layout.attend[q, key]) == expected, ((a, d), (a2, d2))
    assert torch.equal(layout.positions, layout.anchor + layout.depth)


def test_loss_is_zero_when_draft_equals_target_and_positive_otherwise() -> None:
    torch.manual_seed(0)
    target = torch.randn(5, 50)
    vocab = torch.arange(0, 50, 2)
    assert kl_to_target(target[:, vocab], target, vocab).abs().max() < 1e-5
    assert (kl_to_target(torch.randn(5, 25), target, vocab) > 0).all()


def test_short_training_lowers_loss_and_raises_depth1_accuracy(tiny, tmp_path: Path) -> None:
    from tiny_models import TEXT

    from peagle_vllm.train.trainer import TrainRecipe, train

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    recipe = TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(tmp_path / "run"), k=4,
                         variant="depth", steps=100, batch_size=4, seq_len=48, lr=3e-3, draft_vocab=256,
                         self_distill=False, checkpoint_every=50)
    torch.set_num_threads(1)
    train(recipe)
    history = json.loads((tmp_path / "run" / "train_log.json").read_text())["history"]
    first, last = history[:5], history[-5:]
    mean = lambda rows, f: sum(f(r) for r in rows) / len(rows)
    assert mean(last, lambda r: r["loss"]) < 0.7 * mean(first, lambda r: r["loss"])
    assert mean(last, lambda r: r["accuracy"]["0"]) > mean(first, lambda r: r["accuracy"]["0"]) + 0.03
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    with pytest.raises(FileExistsError):
        train(recipe)  # never overwrites a run it is not resuming


def test_self_distillation_trains_on_the_targets_own_continuations(tiny, tmp_path: Path) -> None:
    from tiny_models import TEXT

    from peagle_vllm.train.trainer import TrainRecipe, train

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    recipe = TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(tmp_path / "run"), k=4, variant="standard",
                         steps=3, batch_size=2, seq_len=24, prompt_len=8, draft_vocab=256, distill_pool=8)
    train(recipe)
    pool = torch.load(tmp_path / "run" / "trainer" / "distill_pool.pt")
    assert pool.shape == (8, 25)
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny["target"]).eval()
    with torch.no_grad():  # the greedy half continues its prompt exactly as the target would
        greedy = target.generate(pool[:1, :9], attention_mask=torch.ones(1, 9, dtype=torch.long), max_new_tokens=16,
                                 min_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(greedy[0, :25], pool[0])


def test_killed_run_resumes_from_its_checkpoint_without_loss(tiny, tmp_path: Path, monkeypatch) -> None:
    """Interrupted after its step-4 checkpoint and resumed, a run ends with exactly the weights of an
    uninterrupted run."""
    from safetensors.torch import load_file
    from tiny_models import TEXT

    import peagle_vllm.train.trainer as trainer

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    torch.set_num_threads(1)

    def recipe(name: str) -> trainer.TrainRecipe:
        return trainer.TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(tmp_path / name), k=4,
                                   steps=8, batch_size=2, seq_len=32, draft_vocab=256, self_distill=False,
                                   checkpoint_every=4)

    trainer.train(recipe("straight"))
    real_step, calls = torch.optim.AdamW.step, {"n": 0}

    def dies_at_step_6(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", dies_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(recipe("killed"))
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    trainer.train(recipe("killed"), resume=True)
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_kl_at_positions_equals_kl_on_the_gathered_rows() -> None:
    from peagle_vllm.train.objective import kl_at_positions

    torch.manual_seed(0)
    draft, target = torch.randn(2, 7, 30), torch.randn(2, 5, 30) * 3
    index = torch.tensor([0, 1, 1, 4, 2, 2, 3])
    expected = kl_to_target(draft.flatten(0, 1), target[:, index].flatten(0, 1), None).view(2, 7)
    assert torch.allclose(kl_at_positions(draft, target, index), expected, atol=1e-5)


def test_a_finished_run_continues_in_a_new_stage_with_its_own_schedule_precision_and_depth_decay(
        tiny, tmp_path: Path, monkeypatch) -> None:
    from tiny_models import TEXT

    import peagle_vllm.train.trainer as trainer

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    torch.set_num_threads(1)
    real_step_loss, decays = trainer.step_loss, []

    def step_loss(*args):
        decays.append(args[-1])
        return real_step_loss(*args)

    monkeypatch.setattr(trainer, "step_loss", step_loss)

    def recipe(steps: int, precision: str, depth_decay: float = 0.8) -> trainer.TrainRecipe:
        return trainer.TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(tmp_path / "run"), k=4,
                                   steps=steps, batch_size=2, seq_len=32, draft_vocab=256, self_distill=False,
                                   warmup=2, lr=1e-3, checkpoint_every=2, precision=precision,
                                   depth_decay=depth_decay)

    trainer.train(recipe(4, "float32"))
    with pytest.raises(ValueError, match="--steps 3 is below the 4 steps"):
        trainer.train(recipe(3, "float32"), resume=True)
    with pytest.raises(ValueError, match="precision is 'float16'"):
        trainer.train(recipe(8, "float16"), resume=True)
    with pytest.raises(ValueError, match="depth_decay is 0: pass a number in \\(0, 1\\]"):
        trainer.train(recipe(8, "bfloat16", depth_decay=0), resume=True)
    trainer.train(recipe(8, "bfloat16", depth_decay=0.5), resume=True)
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    same = {"lr": 1e-3, "batch_size": 2, "data": "data.txt", "device": "cpu"}
    assert log["stages"] == [{"start": 0, "end": 4, "precision": "float32", **same, "depth_decay": 0.8},
                             {"start": 4, "end": 8, "precision": "bfloat16", **same, "depth_decay": 0.5}]
    assert decays == [0.8] * 4 + [0.5] * 4
    lrs = [h["lr"] for h in log["history"]]
    assert len(lrs) == 8 and lrs[4] == pytest.approx(lrs[0]) == pytest.approx(5e-4)  # warmup again from step 5
    assert lrs[3] < lrs[4] and lrs[7] < lrs[5]  # each stage decays to its end


def test_stage_lr_warms_up_then_decays_to_zero_within_its_stage() -> None:
    from peagle_vllm.train.trainer import stage_lr

    stage = {"start": 10, "end": 20, "lr": 2.0}
    lrs = [stage_lr(stage, 2, s) for s in range(10, 20)]
    assert lrs[0] == pytest.approx(1.0) and lrs[1] == pytest.approx(2.0 * 0.5 * (1 + math.cos(math.pi / 10)))
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:])) and lrs[-1] < 0.06


def test_a_new_run_starts_from_a_finished_heads_weights_and_continues_its_log(tiny, tmp_path: Path) -> None:
    """--init-from: the run's first step sees the exported head (float16-rounded) with its draft vocabulary, its
    steps, tokens and stages continue the head's log, and a head of another shape is refused by name; a calibrated
    head is continued, and the new head is uncalibrated (its weights changed)."""
    from tiny_models import TEXT

    import peagle_vllm.train.trainer as trainer
    from peagle_vllm.checkpoint import load_head
    from peagle_vllm.harness import calibrate

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    torch.set_num_threads(1)

    def recipe(out: str, steps: int, k: int = 4, lr: float = 1e-3) -> trainer.TrainRecipe:
        return trainer.TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(tmp_path / out), k=k,
                                   steps=steps, batch_size=2, seq_len=32, draft_vocab=256, self_distill=False,
                                   warmup=2, lr=lr, checkpoint_every=2)

    trainer.train(recipe("first", 4))
    with pytest.raises(ValueError, match="trained_depth is 4 \\(this run: 6\\)"):
        trainer.train(recipe("wrong", 6, k=6), init_from=str(tmp_path / "first"))
    with pytest.raises(ValueError, match="drop --resume"):
        trainer.train(recipe("wrong", 6), resume=True, init_from=str(tmp_path / "first"))
    trainer.train(recipe("frozen", 5, lr=0.0), init_from=str(tmp_path / "first"))  # lr 0: the weights stay
    first, frozen = load_head(tmp_path / "first"), load_head(tmp_path / "frozen")
    assert torch.equal(first.d2t, frozen.d2t) and torch.equal(first.t2d, frozen.t2d)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), frozen.state_dict().values()))
    calibrate.write(str(tmp_path / "first"), 0.75)
    assert load_head(tmp_path / "first").cfg.draft_temperature == 0.75
    trainer.train(recipe("second", 8), init_from=str(tmp_path / "first"))
    assert load_head(tmp_path / "second").cfg.draft_temperature == 1.0
    before = json.loads((tmp_path / "first" / "train_log.json").read_text())
    log = json.loads((tmp_path / "second" / "train_log.json").read_text())
    assert [h["step"] for h in log["history"]] == list(range(1, 9))
    assert log["history"][:4] == before["history"]
    assert log["history"][4]["tokens"] > before["history"][-1]["tokens"]
    assert [(s["start"], s["end"]) for s in log["stages"]] == [(0, 4), (4, 8)]
    second = load_head(tmp_path / "second")
    assert not torch.equal(first.fc.weight, second.fc.weight)


def test_a_step_whose_loss_is_not_finite_is_skipped_and_a_run_that_keeps_diverging_stops(tiny, tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """One bad batch (here: a NaN injected into step 3's loss) leaves the weights as they were; a run whose
    every step is non-finite stops after MAX_SKIPPED steps instead of writing NaN weights."""
    from tiny_models import TEXT

    import peagle_vllm.train.trainer as trainer
    from peagle_vllm.checkpoint import read_tensors

    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    torch.set_num_threads(1)
    real_step_loss, calls = trainer.step_loss, []

    def poisoned(bad_steps):
        def step_loss(*args, **kwargs):
            loss, accuracy = real_step_loss(*args, **kwargs)
            calls.append(len(calls) + 1)
            return (loss * float("nan") if calls[-1] in bad_steps else loss), accuracy
        return step_loss

    def recipe(out: str, steps: int) -> trainer.TrainRecipe:
        return trainer.TrainRecipe(target=str(tiny["target"]), data=str(data), out=str(tmp_path / out), k=4,
                                   steps=steps, batch_size=2, seq_len=32, draft_vocab=256, self_distill=False,
                                   warmup=2, lr=1e-3, checkpoint_every=2)

    monkeypatch.setattr(trainer, "step_loss", poisoned({3}))
    trainer.train(recipe("one-bad-batch", 5))
    history = json.loads((tmp_path / "one-bad-batch" / "train_log.json").read_text())["history"]
    assert [h.get("skipped", False) for h in history] == [False, False, True, False, False]
    assert history[2]["tokens"] == history[1]["tokens"] < history[3]["tokens"]  # the skipped batch is not counted
    assert all(torch.isfinite(t.float()).all() for t in read_tensors(tmp_path / "one-bad-batch").values())

    calls.clear()
    monkeypatch.setattr(trainer, "step_loss", poisoned(set(range(1, 100))))
    with pytest.raises(FloatingPointError, match=f"{trainer.MAX_SKIPPED} steps in a row to step {trainer.MAX_SKIPPED}"):
        trainer.train(recipe("diverged", 20))
    state = torch.load(tmp_path / "diverged" / trainer.STATE_DIR / trainer.STATE_FILE, weights_only=False)
    assert all(torch.isfinite(t.float()).all() for t in state["head"].values())
