"""Drafting K tokens per request from a target batch with the vLLM 0.34-layer head equals the core head.

The speculator's own step (`v2.step.draft_step`: fc, row layout, context K/V, ONE query forward, drafts) runs
here on CPU with real vLLM layers (QKVParallelLinear, rotary, RMSNorm, LlamaMLP, ParallelLMHead,
LogitsProcessor). The one thing replaced is the paged-attention kernel: vLLM 0.34 has no CPU attention without
its compiled ops (`vllm._C`), so `run_query` attends with torch's SDPA over exactly the K/V the speculator writes
to the paged cache (the stored context rows of the request, then its query rows, causally)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")

K = 8
MAX_MODEL_LEN = 2048


def _batch(seed: int = 0):
    """Two requests: r0 a decode step of 10 rows (7 history + bonus + 2 drafts... as one chunk) with its last 3
    rows rejected; r1 still prefilling (5 prompt rows, num_sampled 0: its bonus is the next prompt token)."""
    from peagle_vllm.vllm_adapter.v2.step import StepInputs

    g = torch.Generator().manual_seed(seed)
    lens = [10, 5]
    n = sum(lens)
    return StepInputs(
        target_input_ids=torch.randint(0, 512, (n,), generator=g),
        positions=torch.cat([torch.arange(x) for x in lens]),
        query_start_loc=torch.tensor([0, 10, 15], dtype=torch.int32),
        aux_hidden=torch.randn(n, 3 * 64, generator=g),
        num_sampled=torch.tensor([1, 0]), num_rejected=torch.tensor([3, 0]),
        idx_mapping=torch.tensor([3, 1]),
        last_sampled=torch.tensor([0, 0, 0, 77]), next_prefill_tokens=torch.tensor([[0, 99, 0, 0]]),
        temperature=torch.zeros(4))


class PagedCacheStandIn:
    """Holds what the speculator would write to the paged draft KV cache, layer by layer, and attends over it with
    SDPA. Context rows as the speculator stores them: a 1-layer head's K/V from their inputs (`context_kv`), a
    deeper head's by a forward over the target batch's rows (each row attending to its request's rows causally)."""

    def __init__(self, model, inputs) -> None:
        self.model, self.inputs = model, inputs
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> context rows' k, v [N, kv*hd]

    def store(self, context, hidden) -> None:
        self.context = context
        if len(self.model.model.layers) == 1:
            self.kv[0] = self.model.context_kv(context.input_ids, self.inputs.positions, hidden)
        else:
            self.model(context.input_ids, self.inputs.positions, hidden, attend=self.attend_context)

    def _rows(self, r: int) -> torch.Tensor:
        qsl = self.inputs.query_start_loc
        return torch.arange(int(qsl[r]), int(qsl[r + 1]))

    def _sdpa(self, q, k, v, mask):
        cfg = self.model.cfg
        hd, heads, kv_heads = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        qs = q.view(len(q), heads, hd).transpose(0, 1)
        ks = k.view(len(k), kv_heads, hd).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        vs = v.view(len(v), kv_heads, hd).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1).reshape(len(q), -1)

    def attend_context(self, layer, q, k, v):
        """The context forward: q, k, v [N, *] of the target batch's rows -> [N, heads*hd]."""
        self.kv[layer] = (k, v)
        out = []
        for r in range(self.inputs.query_start_loc.shape[0] - 1):
            rows = self._rows(r)
            out.append(self._sdpa(q[rows], k[rows], v[rows], torch.ones(len(rows), len(rows), dtype=torch.bool).tril()))
        return torch.cat(out)

    def attend(self, layer, q, k, v):
        """The query pass: q [B*K, heads*hd], k/v [B*K, kv*hd] -> [B*K, heads*hd], over the stored context rows
        (valid rows before P) and the request's query rows up to each one."""
        key, value = self.kv[layer]
        out = []
        for r in range(self.inputs.query_start_loc.shape[0] - 1):
            rows = self._rows(r)
            stored = rows[self.context.store[rows]]
            c, block = len(stored), slice(r * K, (r + 1) * K)
            mask = torch.ones(K, c + K, dtype=torch.bool).tril(diagonal=c)  # query i sees context + queries <= i
            out.append(self._sdpa(q[block], torch.cat([key[stored], k[block]]), torch.cat([value[stored], v[block]]),
                                  mask))
        return torch.cat(out)

    def run_query(self, query, hidden):
        normed, _ = self.model(query.input_ids, query.positions, hidden, attend=self.attend)
        return normed


def _draft(model, inputs, cache_dtype=torch.float32, draft_temperature=1.0):
    from peagle_vllm.vllm_adapter.v2.step import draft_step

    paged = PagedCacheStandIn(model, inputs)
    with torch.no_grad():
        return draft_step(model, model.mask_states(K - 1), model.draft_to_target, inputs, K, MAX_MODEL_LEN,
                          cache_dtype, paged.store, paged.run_query, draft_temperature)


def _reference(head, inputs, r: int, bonus: int):
    """The core head over request r's full sequence: [shifted context ; bonus ; K-1 mask slots] -> logits [K, V]."""
    qsl, rej = inputs.query_start_loc, inputs.num_rejected
    start, last = int(qsl[r]), int(qsl[r + 1]) - int(rej[r]) - 1
    ids = torch.cat([inputs.target_input_ids[start + 1: last + 1], torch.tensor([bonus])])
    ids[-1] = bonus
    ids = torch.cat([ids, torch.full((K - 1,), head.cfg.mask_token_id)])
    hid = head.combine_hidden_states(inputs.aux_hidden[start: last + 1])
    hid = torch.cat([hid, head.mask_states(K - 1)])
    with torch.no_grad():
        normed, _ = head(ids[None], hid[None], torch.arange(len(ids))[None])
        return head.target_logits(normed[0, -K:])


@pytest.mark.parametrize("name", ["standard", "depth", "vllm_layout", "two_layer"])
def test_one_forward_drafts_equal_the_core_head(make_spec, build_draft_model, name) -> None:
    from peagle_vllm.checkpoint import load_head

    spec = make_spec(name, num_speculative_tokens=K)
    model, head = build_draft_model(spec), load_head(spec.model).eval()
    inputs = _batch()
    before = model.num_forwards
    step = _draft(model, inputs)
    # all K drafts of every request: ONE query forward (a deeper head: after one forward over the context rows)
    assert model.num_forwards == before + (1 if name != "two_layer" else 2)
    assert step.tokens.shape == (2, K)
    for r, bonus in enumerate([77, 99]):
        ref = _reference(head, inputs, r, bonus)
        got = model.to_target_vocab(step.rounded_logits[r])
        finite = torch.isfinite(ref)
        assert torch.equal(finite, torch.isfinite(got))
        torch.testing.assert_close(got[finite], ref[finite], rtol=1e-4, atol=1e-4)
        assert torch.equal(step.tokens[r], ref.argmax(-1))
        # the core's own greedy block drafter agrees too
        qsl, start = inputs.query_start_loc, int(inputs.query_start_loc[r])
        last = int(qsl[r + 1]) - int(inputs.num_rejected[r]) - 1
        block = head.draft_block(torch.tensor([bonus]), inputs.aux_hidden[last][None],
                                 inputs.target_input_ids[start + 1: last + 1][None],
                                 inputs.aux_hidden[start:last][None], K)
        assert torch.equal(step.tokens[r], block[0])


def test_a_draft_temperature_scales_the_cached_logits_and_keeps_greedy_drafts(make_spec, build_draft_model) -> None:
    model = build_draft_model(make_spec("depth", num_speculative_tokens=K))
    inputs = _batch()
    plain, sharpened = _draft(model, inputs), _draft(model, inputs, draft_temperature=0.5)
    # vLLM's rejection kernel divides the cached logits by the request's T: q = softmax(logits / (T x 0.5))
    torch.testing.assert_close(sharpened.rounded_logits, plain.rounded_logits * 2)
    greedy = inputs.temperature[inputs.idx_mapping] <= 0
    assert greedy.any() and torch.equal(sharpened.tokens[greedy], plain.tokens[greedy])


def test_rows_follow_the_eagle_shift_and_depth_layout(make_spec, build_draft_model) -> None:
    model = build_draft_model(make_spec("depth", num_speculative_tokens=K))
    inputs = _batch()
    step = _draft(model, inputs)
    ctx, query = step.context, step.query
    assert ctx.last.tolist() == [6, 14] and ctx.bonus.tolist() == [77, 99]
    assert torch.equal(ctx.input_ids[:6], inputs.target_input_ids[1:7]) and int(ctx.input_ids[6]) == 77
    assert ctx.store.tolist() == [True] * 6 + [False] * 4 + [True] * 4 + [False]  # rejected rows store nothing
    mask_id = model.cfg.mask_token_id
    assert query.input_ids.view(2, K)[:, 0].tolist() == [77, 99]
    assert bool((query.input_ids.view(2, K)[:, 1:] == mask_id).all())
    assert query.positions.view(2, K).tolist() == [list(range(6, 6 + K)), list(range(4, 4 + K))]
    assert query.seq_lens.tolist() == [6 + K, 4 + K]


def test_depth_states_differ_by_depth_and_standard_shares_one(make_spec, build_draft_model) -> None:
    from peagle_vllm.checkpoint import load_head

    for name in ("depth", "standard"):
        spec = make_spec(name, num_speculative_tokens=K)
        model, head = build_draft_model(spec), load_head(spec.model)
        with torch.no_grad():
            got, ref = model.mask_states(K - 1), head.mask_states(K - 1)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert torch.allclose(got[0], got[1]) == (name == "standard")


def test_query_slots_follow_the_block_table() -> None:
    from peagle_vllm.vllm_adapter.v2.layout import PAD_SLOT_ID, query_slots

    table = torch.tensor([[5, 6, 9], [7, 0, 0]])  # block size 4; block 0 is vLLM's null block (unallocated)
    raw = torch.tensor([6, 7, 8, 9, 2, 3, 4, 5])  # K=4: r0 at P=6, r1 at P=2
    slots = query_slots(raw, table, 4, 4, MAX_MODEL_LEN)
    pad = PAD_SLOT_ID
    assert slots.tolist() == [6 * 4 + 2, 6 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1, 7 * 4 + 2, 7 * 4 + 3, pad, pad]
    assert query_slots(raw, table, 4, 4, 8).tolist()[2:4] == [PAD_SLOT_ID, PAD_SLOT_ID]  # past max_model_len


def test_nan_head_drafts_uniformly_and_is_counted(make_spec, build_draft_model) -> None:
    model = build_draft_model(make_spec("standard", num_speculative_tokens=K))
    with torch.no_grad():
        model.lm_head.weight[3].fill_(float("nan"))
    step = _draft(model, _batch())
    assert int(step.num_bad_rows) == 2 * K
    assert bool(torch.isfinite(step.rounded_logits).all())
