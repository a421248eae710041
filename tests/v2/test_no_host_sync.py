"""Nothing in the V2 line's per-step path (layout, drafting, `draft_step` with a real tiny head, logits caching,
`propose` / `observe_verification`) reads device data to the host (a GPU sync each): it runs on FakeTensorMode
tensors, which have no data, so `.item()`, `bool(t)`, `.tolist()`, `int(t)` and data-dependent shapes raise.

Not run here, with stand-ins where the path needs an output: vLLM's paged-attention kernel (a causal attention
over the query rows stands in) and its KV-cache write (`do_kv_cache_update`, recorded instead): GPU kernels;
`PEagleSpeculator._query_attention` (builds vLLM's attention metadata from the runner's block tables and KV-cache
setup; its one `int(...)` reads the host-side `seq_lens_cpu_upper_bound`, no device tensor); the every-WINDOW-steps
metrics flush (one read by design). Compiled vLLM functions run eagerly (see `test_draft_step_with_a_real_head`).
Host-to-device copies of host data are not caught here (fake tensors all live on one device).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from peagle_vllm.corpus_lookup import CorpusLookup  # noqa: E402
from peagle_vllm.corpus_table import CorpusTable  # noqa: E402
from peagle_vllm.harness.fake_tensors import HOST_READS, on_fake  # noqa: E402
from peagle_vllm.lookup import PromptLookup  # noqa: E402

B, K, V, VD, N = 3, 4, 50, 20, 11


@pytest.mark.parametrize("read", [
    lambda t: bool((t > 0).any()), lambda t: t.sum().item(), lambda t: t.tolist(), lambda t: int(t.argmax()),
    lambda t: t[t > 0], lambda t: t.nonzero(),
    lambda t: t if bool((t > 0).any()) else None,  # an all-greedy shortcut, as a branch on device data
])
def test_the_harness_raises_on_every_host_read(read) -> None:
    with pytest.raises(HOST_READS):
        on_fake(read, torch.randn(3, 4))
    read(torch.randn(3, 4))  # the same read on real tensors is fine: the harness is what fails it


def _layout(ids, positions, qsl, num_sampled, num_rejected, idx_mapping, last_sampled, next_prefill, hidden,
            mask_states, block_table):
    """Every `layout` function, chained as `draft_step` and `_query_attention` chain them."""
    from peagle_vllm.vllm_adapter.v2 import layout

    bonus = layout.bonus_tokens(num_sampled, idx_mapping, last_sampled, next_prefill)
    context = layout.context_rows(ids, qsl, num_rejected, bonus)
    query = layout.query_rows(positions, context.last, bonus, K, 7, 64)
    rows = layout.query_hidden(hidden, context.last, mask_states, K)
    return context, query, rows, layout.query_slots(query.raw_positions, block_table, 4, K, 64)


@pytest.mark.parametrize("lookahead", [None, 2])
def test_layout(lookahead) -> None:
    max_reqs, h = 6, 8
    next_prefill = torch.randint(0, V, (max_reqs,) if lookahead is None else (lookahead, max_reqs))
    context, query, rows, slots = on_fake(
        _layout, torch.randint(0, V, (N + 2,)), torch.arange(N + 2), torch.tensor([0, 4, 9, N], dtype=torch.int32),
        torch.tensor([1, 0, 2]), torch.tensor([1, 0, 0]), torch.tensor([4, 0, 2]), torch.randint(0, V, (max_reqs,)),
        next_prefill, torch.randn(N + 2, h), torch.randn(K - 1, h), torch.randint(1, 9, (B, 20)))
    assert context.input_ids.shape == context.store.shape == (N + 2,) and context.last.shape == (B,)
    assert query.input_ids.shape == query.positions.shape == query.depth.shape == (B * K,)
    assert rows.shape == (B * K, h) and slots.shape == (B * K,)


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cut", [False, True])  # the requests' top-k/top-p applied to sampled drafts
def test_drafting_and_caching(mapped, cache_dtype, cut) -> None:
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    top_k, top_p = (torch.tensor([5, 3, VD]), torch.tensor([1.0, 0.9, 0.8])) if cut else (None, None)

    def draft_and_cache(logits, d2t, temperature, values, idx_mapping, top_k, top_p):
        tokens, rounded, num_bad = draft_block(logits, d2t, temperature, cache_dtype, top_k, top_p)
        cache_draft_logits(values, idx_mapping, rounded, d2t)
        return tokens, rounded, num_bad, values

    vd = VD if mapped else V
    logits = torch.randn(B, K, vd)
    logits[1, 2, 3] = float("nan")
    d2t = torch.randperm(V)[:VD] if mapped else None
    tokens, rounded, num_bad, values = on_fake(draft_and_cache, logits, d2t, torch.tensor([0.0, 0.7, 1.2]),
                                               torch.zeros(8, K, V, dtype=cache_dtype), torch.tensor([5, 0, 3]),
                                               top_k, top_p)
    assert tokens.shape == (B, K) and tokens.dtype == torch.int64 and num_bad.shape == ()
    assert rounded.shape == (B, K, vd) and rounded.dtype == cache_dtype and values.shape == (8, K, V)


def test_acceptance_counts_per_step() -> None:
    from peagle_vllm.vllm_adapter.v2.metrics import VerificationCounts

    def observe(num_sampled, num_rejected):
        counts = VerificationCounts(K, "cpu", 0.5, window=3)
        counts.observe(num_sampled, num_rejected)
        counts.observe(num_sampled, num_rejected)  # the flush (one read every `window` steps) is not per step
        return counts

    counts = on_fake(observe, torch.tensor([2, 0, 5]), torch.tensor([3, 0, 0]))
    assert counts.num_steps == 2 and counts.accepted_per_position.shape == (K,)


@contextlib.contextmanager
def fake_weights(model: torch.nn.Module, mode: FakeTensorMode):
    """model with every parameter and buffer replaced by a fake copy (so its forward runs fake), restored on exit:
    vLLM shares some modules between models (`get_rope` caches its rotary embeddings)."""
    saved = []
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in list(store.items()):
                if tensor is not None:
                    saved.append((store, name, tensor))
                    fake = mode.from_tensor(tensor.detach())
                    store[name] = torch.nn.Parameter(fake, requires_grad=False) if store is module._parameters else fake
    try:
        yield model
    finally:
        for store, name, tensor in saved:
            store[name] = tensor


def _causal_over_queries(heads: int, kv_heads: int, hd: int):
    """attend(layer, q, k, v) [B*K, heads*hd / kv_heads*hd] -> [B*K, heads*hd]: causal attention within each
    request's K query rows (a data-independent stand-in for the paged kernel, which also reads the stored context)."""
    def attend(layer, q, k, v):
        b = q.shape[0] // K
        q = q.view(b, K, heads, hd).transpose(1, 2)
        k, v = (x.view(b, K, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1) for x in (k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b * K, heads * hd)
    return attend


def _draft_step_on(model, attend):
    """step(mask_states, draft_to_target, **StepInputs fields) -> (DraftStep, stored context keys): `draft_step`
    with `attend` in place of the paged kernel and the context K/V kept instead of written to the paged cache."""
    from peagle_vllm.vllm_adapter.v2.step import StepInputs, draft_step

    def step(mask_states, draft_to_target, **fields):
        inputs, stored = StepInputs(**fields), []

        def store_context(context, hidden):
            stored.append(model.context_kv(context.input_ids, inputs.positions, hidden)[0])

        def run_query(query, hidden):
            return model(query.input_ids, query.positions, hidden, attend=attend)[0]

        return draft_step(model, mask_states, draft_to_target, inputs, K, 64, torch.bfloat16, store_context,
                          run_query), stored

    return step


@pytest.mark.parametrize("name", ["standard", "depth"])  # target vocabulary / a 256-token draft vocabulary
def test_draft_step_with_a_real_head(make_spec, build_draft_model, name) -> None:
    from peagle_vllm.vllm_adapter.v2.step import StepInputs

    model = build_draft_model(make_spec(name, num_speculative_tokens=K))
    cfg = model.cfg
    with torch.no_grad():
        mask_states, d2t = model.mask_states(K - 1), model.draft_to_target  # taken once at load (host reads fine)
    mode = FakeTensorMode()
    step = _draft_step_on(model, _causal_over_queries(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim))
    lens = [5, 4, 2]
    inputs = StepInputs(torch.randint(0, cfg.vocab_size, (N,)), torch.cat([torch.arange(x) for x in lens]),
                        torch.tensor([0, 5, 9, N], dtype=torch.int32), torch.randn(N, cfg.num_aux * 64),
                        torch.tensor([2, 0, 1]), torch.tensor([1, 0, 0]), torch.tensor([3, 1, 0]),
                        torch.randint(0, cfg.vocab_size, (4,)), torch.randint(0, cfg.vocab_size, (1, 4)),
                        torch.tensor([0.0, 0.8, 1.0, 0.0]))  # a mixed batch: temperatures 0, 0.8, 0
    # vLLM torch.compiles SiluAndMul's native forward on this platform; compiled code would run its CPU kernel
    # on the fake tensors' (absent) data, so compiled functions run eagerly here (the same torch ops)
    with torch.no_grad(), torch.compiler.set_stance("force_eager"), fake_weights(model, mode):
        out, stored = on_fake(step, mask_states, d2t, mode=mode, **vars(inputs))
    assert out.tokens.shape == (B, K) and out.rounded_logits.shape == (B, K, cfg.draft_vocab_size)
    assert stored[0].shape[0] == N and model.num_forwards == 1


def _fake_speculator(model, vllm_env, mode: FakeTensorMode):
    """A PEagleSpeculator built under `mode` (its buffers fake) around `model` (built for vllm_env's speculative
    config, weights still real), the head's constants taken as at load (which may read the device), made fake."""
    from peagle_vllm.vllm_adapter.v2.speculator import PEagleSpeculator

    with mode:
        s = PEagleSpeculator(vllm_env, torch.device("cpu"))
    s.model = model
    s._prepare_head()
    s._mask_states = mode.from_tensor(s._mask_states)
    if s._draft_to_target is not None:
        s._draft_to_target = mode.from_tensor(s._draft_to_target)
    return s


@pytest.mark.parametrize("name", ["standard", "depth", "two_layer"])
@pytest.mark.parametrize("dummy_run", [True, False])
@pytest.mark.parametrize("lookup", ["none", "prompt", "prompt and corpus"])
def test_speculator_propose_and_observe(make_spec, build_draft_model, vllm_env, name, dummy_run, lookup) -> None:
    """`PEagleSpeculator.propose` and `observe_verification`, every tensor fake, the speculator's buffers included
    ('standard' shares the target vocabulary: the case where `model.draft_to_target` reads d2t). A real step
    (dummy_run False) also stores context K/V and caches the draft logits; two stand-ins there: a recorder for
    vLLM's KV-cache write kernel, and no attention metadata (`_query_attention` builds vLLM's from the runner's
    block tables), so vLLM's attention layer computes nothing, as in its dummy runs. A two-layer head runs its
    context forward instead of the 1-layer K/V store. With lookups on, a real step also scans the runner's token
    history (`batch_lookup`) and walks the corpus's table (`corpus_table`)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.spec_decode.draft_logits import DraftLogitsCache

    mode, b, n = FakeTensorMode(), 3, 12
    model = build_draft_model(make_spec(name, num_speculative_tokens=K))
    table = CorpusTable.of(CorpusLookup([([1, 2], [3, 4, 5, 3, 4, 6])]))
    corpus = table.with_tensors(*map(mode.from_tensor, table.tensors))
    with set_current_vllm_config(vllm_env), torch.no_grad(), torch.compiler.set_stance("force_eager"):
        s = _fake_speculator(model, vllm_env, mode)
        writes = []
        s.model.store_context_kv = lambda key, value, slots: writes.append(slots)
        s._query_attention = lambda input_batch, query, k: (None, None)
        s._layer_name = "draft"
        with fake_weights(model, mode), mode:
            # what prepare_propose takes from the runner's sampling states when some request uses top-k and top-p
            s._cut = (torch.full((s.max_num_reqs,), 5, dtype=torch.int32), torch.full((s.max_num_reqs,), 0.9))
            if lookup != "none":  # what prepare_propose takes from the runner: its RequestState's token history
                s.lookup = PromptLookup(2, 5)
                s.corpus = corpus if lookup == "prompt and corpus" else None
                s._history = SimpleNamespace(
                    all_token_ids=SimpleNamespace(gpu=torch.zeros(s.max_num_reqs, 64, dtype=torch.int32)),
                    total_len=SimpleNamespace(gpu=torch.full((s.max_num_reqs,), 10, dtype=torch.int32)))
            if not dummy_run:
                s.draft_logits = DraftLogitsCache(s.max_num_reqs, K, s.vocab_size, dtype=torch.bfloat16, fill=0.0,
                                                  device="cpu")
            batch = InputBatch.make_dummy(b, n, InputBuffers(s.max_num_reqs, s.max_num_tokens, torch.device("cpu")))
            z = torch.arange(s.max_num_reqs)  # last_sampled, next_prefill_tokens, seeds; (z % 2) temperatures 0 / 1
            drafts = s.propose(batch, None, {"draft": torch.arange(n)}, torch.zeros(n, 64),
                               [torch.randn(n, 64) for _ in range(3)], torch.ones(b, dtype=torch.long),
                               torch.zeros(b, dtype=torch.long), z, z.view(1, -1), (z % 2).float(), z,
                               dummy_run=dummy_run, skip_attn_for_dummy_run=dummy_run)
            s.observe_verification(batch.idx_mapping, torch.ones(b, dtype=torch.long), torch.zeros(b, dtype=torch.long))
    assert drafts.shape == (b, K) and s.num_proposals == 1 and s.metrics.num_steps == 1
    one_layer = name != "two_layer"
    assert len(writes) == (1 if one_layer and not dummy_run else 0)
    assert model.num_forwards == (1 if one_layer else 2)
