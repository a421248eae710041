"""PEagleSpeculator itself, built by vLLM 0.34's own DraftModelSpeculator constructor on CPU, proposing on the
batch vLLM's runner uses for its dummy runs (`InputBatch.make_dummy`, no attention metadata: vLLM's attention
layer then computes nothing, as in its memory-profiling run).

Not reachable here: `load_model` (vLLM's `get_model` builds the attention layer with the platform's backend,
and the CPU platform of vLLM 0.34 needs `vllm._C` and triton-cpu), and a propose with attention metadata and
a paged KV cache (`set_attn`, `_query_attention`): they need the V2 runner's KV-cache setup on a GPU. The step
they wrap is checked against the core head in test_drafting.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


def _speculator(make_spec, build_draft_model, vllm_env, head: str, **fields):
    from vllm.config import set_current_vllm_config

    from peagle_vllm.vllm_adapter.v2.speculator import PEagleSpeculator

    spec = make_spec(head, num_speculative_tokens=6, **fields)
    model = build_draft_model(spec)  # sets vllm_env.speculative_config = spec
    with set_current_vllm_config(vllm_env):
        s = PEagleSpeculator(vllm_env, torch.device("cpu"))
    s.model = model  # what load_model does: vLLM's get_model, then the head's per-step constants
    s._prepare_head()
    return s


@pytest.fixture()
def speculator(make_spec, build_draft_model, vllm_env):
    return _speculator(make_spec, build_draft_model, vllm_env, "depth")


def _propose(s, batch, num_sampled, **kwargs):
    from vllm.config import set_current_vllm_config

    b, n = batch.num_reqs, batch.num_tokens
    aux = [torch.randn(n, 64) for _ in range(3)]
    with set_current_vllm_config(s.vllm_config):
        return s.propose(batch, None, None, torch.zeros(n, 64), aux, num_sampled, torch.zeros(b, dtype=torch.long),
                         torch.zeros(s.max_num_reqs, dtype=torch.long),
                         torch.zeros(1, s.max_num_reqs, dtype=torch.long), torch.zeros(s.max_num_reqs),
                         torch.zeros(s.max_num_reqs, dtype=torch.long), dummy_run=True,
                         skip_attn_for_dummy_run=True, **kwargs)


def test_dummy_run_proposes_k_drafts_per_request_in_one_forward(speculator) -> None:
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    s = speculator
    assert (s.k, s.num_query_per_req) == (6, 6)
    batch = InputBatch.make_dummy(3, 12, InputBuffers(s.max_num_reqs, s.max_num_tokens, torch.device("cpu")))
    before = s.model.num_forwards
    drafts = _propose(s, batch, torch.ones(3, dtype=torch.long))
    assert drafts.shape == (3, 6) and drafts.dtype == torch.int64
    assert s.model.num_forwards == before + 1 and s.num_proposals == 1
    assert bool((drafts >= 0).all()) and bool((drafts < 512).all())
    assert s.draft_logits is None  # allocated by load_model; dummy runs never write it anyway


def test_a_two_layer_head_runs_a_context_forward_then_one_query_forward(make_spec, build_draft_model,
                                                                        vllm_env) -> None:
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    s = _speculator(make_spec, build_draft_model, vllm_env, "two_layer")
    batch = InputBatch.make_dummy(3, 12, InputBuffers(s.max_num_reqs, s.max_num_tokens, torch.device("cpu")))
    drafts = _propose(s, batch, torch.ones(3, dtype=torch.long))
    assert drafts.shape == (3, 6) and s.model.num_forwards == 2 and s.num_proposals == 1
    _propose(s, batch, torch.ones(3, dtype=torch.long), num_speculative_tokens=0)  # no drafts: the context still
    assert s.model.num_forwards == 3  # goes through the head, so its later layers' K/V stay in step


def test_a_batch_size_schedule_asking_fewer_drafts_gets_that_many_from_fewer_query_rows(speculator) -> None:
    """vLLM's `num_speculative_tokens_per_batch_size` hands propose k < K: k query rows per request, k drafts."""
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    s, rows = speculator, []
    s.model.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    batch = InputBatch.make_dummy(3, 12, InputBuffers(s.max_num_reqs, s.max_num_tokens, torch.device("cpu")))
    drafts = _propose(s, batch, torch.ones(3, dtype=torch.long), num_speculative_tokens=2)
    assert rows == [3 * 2] and drafts.shape == (3, 6)
    assert bool((drafts[:, :2] >= 0).all()) and drafts[:, 2:].tolist() == [[-1] * 4] * 3
    _propose(s, batch, torch.ones(3, dtype=torch.long))
    assert rows == [3 * 2, 3 * 6]  # the full K again when the schedule gives it


def test_no_draft_step_runs_no_forward(speculator) -> None:
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    s = speculator
    batch = InputBatch.make_dummy(2, 4, InputBuffers(s.max_num_reqs, s.max_num_tokens, torch.device("cpu")))
    before = s.model.num_forwards
    drafts = _propose(s, batch, torch.ones(2, dtype=torch.long), num_speculative_tokens=0)
    assert drafts.tolist() == [[-1] * 6] * 2 and s.model.num_forwards == before


def test_observe_verification_feeds_the_metrics(speculator) -> None:
    s = speculator
    s.observe_verification(torch.tensor([0, 1]), torch.tensor([3, 0]), torch.tensor([4, 0]))
    assert s.metrics.num_steps == 1
    assert s.metrics.accepted_per_position.tolist()[:3] == [1, 1, 0]


def test_prepare_propose_takes_top_k_and_top_p_only_when_a_request_of_the_batch_uses_them(speculator) -> None:
    """The runner's SamplingStates hold top_k/top_p per request slot as UVA tensors (host `.np`, device `.gpu`;
    vLLM's class needs CUDA to build, so its fields stand in here, filled as its add_request fills them)."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    s, vocab = speculator, 512

    def uva(values, dtype):
        host = np.array(values + [values[0]] * (s.max_num_reqs - len(values)))
        return SimpleNamespace(np=host, gpu=torch.tensor(host, dtype=dtype))

    # slot 0: plain sampling; slot 1: top_p 0.9; slot 2: top_k 20 (off is vocab_size / 1.0)
    states = SimpleNamespace(vocab_size=vocab, top_k=uva([vocab, vocab, 20], torch.int32),
                             top_p=uva([1.0, 0.9, 1.0], torch.float32))
    sampler = SimpleNamespace(sampling_states=states)
    buffers = InputBuffers(s.max_num_reqs, s.max_num_tokens, torch.device("cpu"))

    def cut_for(num_reqs: int):
        batch = InputBatch.make_dummy(num_reqs, 2 * num_reqs, buffers)  # requests at slots 0..num_reqs-1
        s.prepare_propose(batch, torch.ones(num_reqs, dtype=torch.long), torch.zeros(num_reqs, dtype=torch.long),
                          sampler)
        return s._cut

    assert cut_for(1) == (None, None)  # plain sampling: no sort in the draft step
    top_k, top_p = cut_for(2)
    assert top_k is None and top_p is states.top_p.gpu
    top_k, top_p = cut_for(3)
    assert top_k is states.top_k.gpu and top_p is states.top_p.gpu


def test_prompt_lookup_drafts_a_requests_first_depths_from_its_own_text(make_spec, build_draft_model,
                                                                        vllm_env) -> None:
    """Three requests with the same text: the greedy one and the sampled one take the continuation of their suffix
    5 6 (7 8 5 6), the head's drafts after it; the one still prefilling keeps the head's drafts."""
    from types import SimpleNamespace

    from peagle_vllm.vllm_adapter.v2.step import StepInputs

    s = _speculator(make_spec, build_draft_model, vllm_env, "depth", speculator_options={"prompt_lookup_max": 3})
    assert (s.lookup.min_n, s.lookup.max_n) == (2, 3)
    tokens = torch.zeros(s.max_num_reqs, 16, dtype=torch.int32)
    tokens[:3, :6] = torch.tensor([5, 6, 7, 8, 5, 6], dtype=torch.int32)
    s.prepare_propose(SimpleNamespace(idx_mapping=torch.tensor([2, 0, 1])), torch.tensor([1, 1, 0]),
                      torch.zeros(3, dtype=torch.long), SimpleNamespace(
        req_states=SimpleNamespace(all_token_ids=SimpleNamespace(gpu=tokens),
                                   total_len=SimpleNamespace(gpu=torch.full((s.max_num_reqs,), 6)))))
    none = torch.zeros(0)
    inputs = StepInputs(none, none, none, none, num_sampled=torch.tensor([1, 1, 0]), num_rejected=none,
                        idx_mapping=torch.tensor([2, 0, 1]), last_sampled=none, next_prefill_tokens=none,
                        temperature=torch.tensor([1.0, 0.0, 0.0] + [0.0] * (s.max_num_reqs - 3)))
    drafts, looked_up = s._with_lookups(torch.full((3, 6), 99), inputs)
    # batch rows at slots 2, 0, 1: greedy (T=0 at slot 2), sampled (T=1 at slot 0), prefilling (nothing sampled)
    assert drafts.tolist() == [[7, 8, 5, 6, 99, 99], [7, 8, 5, 6, 99, 99], [99] * 6]
    assert looked_up.tolist() == [[True] * 4 + [False] * 2] * 2 + [[False] * 6]


def test_corpus_lookup_drafts_where_the_requests_own_text_has_none(make_spec, build_draft_model, vllm_env,
                                                                  tmp_path) -> None:
    """A corpus of one answer, 5 6 40 41 42 43 after the prompt tail 2. The request whose text repeats itself
    (2 5 6 7 9 2 5 6) takes its own continuation; the one ending 2 5 6 without a repeat walks the corpus
    (40 41 42 43, then the answer ends); the one still prefilling keeps the head's drafts."""
    import json
    from types import SimpleNamespace

    from peagle_vllm.vllm_adapter.v2.step import StepInputs

    (tmp_path / "answers.jsonl").write_text(json.dumps({"prompt_ids": [2], "response_ids": [5, 6, 40, 41, 42, 43]}))
    s = _speculator(make_spec, build_draft_model, vllm_env, "depth",
                    speculator_options={"prompt_lookup_max": 3, "lookup_corpus": str(tmp_path)})
    assert s.corpus is not None and s.corpus.min_n == 3
    tokens = torch.zeros(s.max_num_reqs, 16, dtype=torch.int32)
    texts = {2: [2, 5, 6, 7, 9, 2, 5, 6], 0: [1, 2, 5, 6], 1: [2, 5, 6]}  # by request slot
    for slot, text in texts.items():
        tokens[slot, :len(text)] = torch.tensor(text, dtype=torch.int32)
    lengths = torch.zeros(s.max_num_reqs, dtype=torch.int32)
    lengths[list(texts)] = torch.tensor([len(t) for t in texts.values()], dtype=torch.int32)
    rows = torch.tensor([2, 0, 1])
    s.prepare_propose(SimpleNamespace(idx_mapping=rows), torch.tensor([1, 1, 0]), torch.zeros(3, dtype=torch.long),
                      SimpleNamespace(req_states=SimpleNamespace(all_token_ids=SimpleNamespace(gpu=tokens),
                                                                 total_len=SimpleNamespace(gpu=lengths))))
    none = torch.zeros(0)
    inputs = StepInputs(none, none, none, none, num_sampled=torch.tensor([1, 1, 0]), num_rejected=none,
                        idx_mapping=rows, last_sampled=none, next_prefill_tokens=none,
                        temperature=torch.zeros(s.max_num_reqs))
    drafts, looked_up = s._with_lookups(torch.full((3, 6), 99), inputs)
    assert drafts.tolist() == [[7, 9, 2, 5, 6, 99], [40, 41, 42, 43, 99, 99], [99] * 6]
    assert looked_up.sum(1).tolist() == [5, 4, 0] and int(s.metrics.lookup_drafts) == 9
