"""Feature matrix, offline rows (docs/feature-matrix.md): vLLM features used together with p_eagle on
SmolLM2-135M-Instruct and its depth head, fixed K=8 (so that every step speculates). Each row: greedy
output identical to the same request without speculation; where sampling is involved, seeded requests
repeat exactly and a small chi-square keeps the target's distribution; what vLLM refuses under
speculation is tested as refused.

One plain and one p_eagle engine serve most rows (module fixture); chunked prefill and preemption share
one small-budget p_eagle engine, LoRA builds its own pair. The structured-output rows print their
acceptance length (measured, not asserted); `scripts/feature_matrix.py` measures it beside unconstrained
generation on the same prompts and writes results/feature-matrix/."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from peagle_vllm.harness.feature_matrix import KINDS, messages_for, structured_outputs
from peagle_vllm.harness.prompts import EVAL_PROMPTS, chat_prompts, read_user_messages
from peagle_vllm.harness.runs import close_llm, make_llm, request_spec_figures

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "smollm2-peagle-depth"
SPEC = {"method": "p_eagle", "model": str(DRAFT), "num_speculative_tokens": 8, "adaptive": False}
# a coding question (one whose structured answers finish within 32 tokens) and a general one
MESSAGES = ["Write a Python function that reverses a string.", read_user_messages(EVAL_PROMPTS)[26]]
REFUSED = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
BLOCK = 128  # vLLM's CPU KV block size
SMALL_BLOCKS = 5  # the small engine's usable KV cache: 640 tokens (vLLM keeps one more block as its null block)

pytestmark = pytest.mark.timeout(900)
ACCEPTANCE: dict[str, float] = {}


@pytest.fixture(scope="module")
def engines(smollm2):
    """(plain, p_eagle): the p_eagle engine reports each request's own spec-decode figures."""
    plain = make_llm(str(smollm2), None)
    ours = make_llm(str(smollm2), SPEC, per_request_spec_decode_metrics="summary")
    yield plain, ours
    close_llm(ours)
    close_llm(plain)
    if ACCEPTANCE:  # beside unconstrained generation on the same prompts: scripts/feature_matrix.py
        print("\nacceptance length under structured outputs, p_eagle K=8: "
              + ", ".join(f"{kind} {x:.2f}" for kind, x in ACCEPTANCE.items()))


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[str]:
    return chat_prompts(smollm2, MESSAGES)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)


@pytest.fixture(scope="module")
def free(engines, prompts):
    """Plain greedy decoding of `prompts`, 32 tokens: the reference that rows change with an option."""
    from vllm import SamplingParams

    return engines[0].generate(prompts, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)


def _proposals(worker) -> int:
    return worker.model_runner.drafter.num_proposals


def proposals(llm) -> int:
    (n,) = llm.collective_rpc(_proposals)
    return n


def run_both(engines, prompts, params, **kwargs):
    """The same request on the plain and on the p_eagle engine; the p_eagle proposer must have drafted."""
    plain, ours = engines
    a = plain.generate(prompts, params, use_tqdm=False, **kwargs)
    before = proposals(ours)
    b = ours.generate(prompts, params, use_tqdm=False, **kwargs)
    assert proposals(ours) > before, "the p_eagle proposer never ran: the row would not exercise speculation"
    return a, b


def ids(outs) -> list[list[list[int]]]:
    """Token ids of every completion of every request."""
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


def texts(outs) -> list[str]:
    return [o.outputs[0].text for o in outs]


# --- structured outputs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(KINDS))
def test_structured_output_greedy_identical(engines, smollm2, kind: str) -> None:
    from vllm import SamplingParams

    ps = chat_prompts(smollm2, messages_for(kind, MESSAGES))
    params = SamplingParams(temperature=0, max_tokens=32, structured_outputs=structured_outputs(kind))
    a, b = run_both(engines, ps, params)
    assert ids(b) == ids(a)
    finished = [o.outputs[0].text for o in b if o.outputs[0].finish_reason == "stop"]
    assert all(KINDS[kind].valid(t) for t in finished), finished
    if kind in ("choice", "json_schema"):  # short enough to finish within 32 tokens
        assert len(finished) == len(b), texts(b)
    ACCEPTANCE[kind] = request_spec_figures(b).acceptance_length
    print(f"{kind}: acceptance length {ACCEPTANCE[kind]:.2f}; {texts(b)}")


# --- logprobs -----------------------------------------------------------------------------------------------

def _same_logprobs(x: list[dict] | None, y: list[dict] | None, tol: float = 2e-3) -> None:
    assert x is not None and y is not None and len(x) == len(y)
    for pos, (u, v) in enumerate(zip(x, y)):
        if u is None or v is None:
            assert u is None and v is None
            continue
        assert set(u) == set(v), f"position {pos}: top tokens differ: {sorted(u)} vs {sorted(v)}"
        for tok in u:
            assert abs(u[tok].logprob - v[tok].logprob) <= tol, (pos, tok, u[tok].logprob, v[tok].logprob)
            assert u[tok].rank == v[tok].rank, (pos, tok)


def test_logprobs_and_prompt_logprobs_match_plain_decoding(engines, prompts) -> None:
    from vllm import SamplingParams

    a, b = run_both(engines, prompts, SamplingParams(temperature=0, max_tokens=16, logprobs=5, prompt_logprobs=3))
    assert ids(b) == ids(a)
    assert request_spec_figures(b).drafts > 0
    for x, y in zip(a, b):
        assert len(y.outputs[0].logprobs) == len(y.outputs[0].token_ids)
        _same_logprobs(x.outputs[0].logprobs, y.outputs[0].logprobs)
        _same_logprobs(x.prompt_logprobs, y.prompt_logprobs)


# --- n > 1 --------------------------------------------------------------------------------------------------

def test_n2_at_temperature_0_is_refused_alike(engines, prompts) -> None:
    """vLLM refuses n > 1 at temperature 0 with or without speculation: the same one-line error."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    messages = []
    for llm in engines:
        with pytest.raises(VLLMValidationError) as err:
            llm.generate(prompts[:1], SamplingParams(n=2, temperature=0, max_tokens=8), use_tqdm=False)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and messages[0].startswith("n must be 1 when using greedy sampling")


def test_n2_top_k_1_identical_to_greedy(engines, prompts, free) -> None:
    """n=2 through the sampling path made deterministic (T=1, top_k=1): both completions are greedy decoding."""
    from vllm import SamplingParams

    a, b = run_both(engines, prompts, SamplingParams(n=2, temperature=1.0, top_k=1, max_tokens=24))
    assert ids(b) == ids(a)
    for out, ref in zip(b, free):
        assert [list(c.token_ids) for c in out.outputs] == [list(ref.outputs[0].token_ids)[:24]] * 2


def test_seeded_n2_repeats_and_equals_its_children_seeds(engines, prompts) -> None:
    """Seeded n=2 under p_eagle repeats exactly, and child i is the n=1 request with seed + i (vLLM's rule)."""
    from vllm import SamplingParams

    ours = engines[1]
    params = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 16}
    first = ours.generate(prompts[1:], SamplingParams(n=2, seed=1234, **params), use_tqdm=False)
    again = ours.generate(prompts[1:], SamplingParams(n=2, seed=1234, **params), use_tqdm=False)
    single = ours.generate(prompts[1:] * 2, [SamplingParams(seed=s, **params) for s in (1234, 1235)], use_tqdm=False)
    assert ids(again) == ids(first)
    assert ids(first)[0] == [c[0] for c in ids(single)]


# --- stop strings, stop_token_ids, min_tokens ---------------------------------------------------------------

def test_stop_strings_end_inside_a_speculative_block(engines, prompts, free, tokenizer) -> None:
    """Each request's stop string is taken from the middle of its plain output, so that it is met inside
    a block of drafts; what follows it in the block must be dropped."""
    from vllm import SamplingParams

    stops = [tokenizer.decode(list(o.outputs[0].token_ids)[14:16]) for o in free]
    assert all(s.strip() for s in stops), stops
    params = [SamplingParams(temperature=0, max_tokens=32, stop=[s]) for s in stops]
    a, b = run_both(engines, prompts, params)
    assert ids(b) == ids(a) and texts(b) == texts(a)
    for out, stop in zip(b, stops):
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == stop and stop not in c.text
        assert len(c.token_ids) <= 16


def test_stop_token_ids(engines, prompts, free) -> None:
    from vllm import SamplingParams

    stop_ids = [list(o.outputs[0].token_ids)[20] for o in free]
    params = [SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[t]) for t in stop_ids]
    a, b = run_both(engines, prompts, params)
    assert ids(b) == ids(a)
    for out, tok in zip(b, stop_ids):
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == tok and len(c.token_ids) <= 21


def test_min_tokens_holds_back_eos(engines, smollm2) -> None:
    from vllm import SamplingParams

    ps = chat_prompts(smollm2, ["What is 2 + 2? Reply with the number only.",
                                "What is the capital of France? One word."])
    natural = engines[0].generate(ps, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) < 12 for o in natural), "the prompts no longer end early"
    a, b = run_both(engines, ps, SamplingParams(temperature=0, max_tokens=32, min_tokens=20))
    assert ids(b) == ids(a)
    assert all(len(o.outputs[0].token_ids) >= 20 for o in b)


# --- penalties ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("penalty", [{"presence_penalty": 1.5}, {"frequency_penalty": 1.0},
                                     {"repetition_penalty": 1.3}], ids=lambda p: next(iter(p)))
def test_penalty_greedy_identical(engines, prompts, free, penalty: dict) -> None:
    from vllm import SamplingParams

    a, b = run_both(engines, prompts, SamplingParams(temperature=0, max_tokens=32, **penalty))
    assert ids(b) == ids(a)
    assert ids(a) != ids(free), "the penalty changed nothing: the row would not test it"


def _chi2_pvalue(a: list[int], b: list[int], top: int = 10) -> float:
    from scipy.stats import chi2_contingency

    common = [t for t, _ in (Counter(a) + Counter(b)).most_common(top)]
    rows = [[sum(x == t for x in s) for t in common] + [sum(x not in common for x in s)] for s in (a, b)]
    rows = [[r[i] for i in range(len(r)) if rows[0][i] + rows[1][i] > 0] for r in rows]
    return chi2_contingency(rows).pvalue


def test_sampled_with_penalties_keeps_the_target_distribution(engines) -> None:
    """160 seeded samples of 3 tokens of a repetitive prompt, T=1 with all three penalties: the 2nd and
    3rd tokens (made by verification) follow the plain engine's distribution."""
    from vllm import SamplingParams

    prompt, n = "apple, banana, apple, cherry, apple, banana,", 160
    params = [SamplingParams(temperature=1.0, max_tokens=3, seed=i, ignore_eos=True, presence_penalty=0.5,
                             frequency_penalty=0.5, repetition_penalty=1.2) for i in range(n)]
    a, b = run_both(engines, [prompt] * n, params)
    assert request_spec_figures(b).drafts >= n
    for pos in (1, 2):
        p = _chi2_pvalue([o.outputs[0].token_ids[pos] for o in a], [o.outputs[0].token_ids[pos] for o in b])
        assert p > 0.001, f"position {pos}: p_eagle changes the sampled distribution under penalties (p={p:.1e})"


# --- refused under speculation: min_p, logit_bias ------------------------------------------------------------

@pytest.mark.parametrize("option", [{"min_p": 0.1}, {"logit_bias": {42: 5.0}}], ids=lambda o: next(iter(o)))
def test_min_p_and_logit_bias_are_refused_per_request(engines, prompts, option: dict) -> None:
    """vLLM refuses these requests under any speculation (its logits processors for them are not built);
    the refusal is one clear error for that request, and the engine goes on serving."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    plain, ours = engines
    params = SamplingParams(temperature=0.7, max_tokens=4, seed=0, **option)
    assert len(plain.generate(prompts[:1], params, use_tqdm=False)[0].outputs[0].token_ids) == 4
    with pytest.raises(VLLMValidationError) as err:
        ours.generate(prompts[:1], params, use_tqdm=False)
    assert str(err.value).splitlines()[0].startswith(REFUSED)
    a, b = run_both(engines, prompts[:1], SamplingParams(temperature=0, max_tokens=8))
    assert ids(b) == ids(a)


# --- bad words, per-request seed ----------------------------------------------------------------------------

def test_bad_words(engines, prompts, free) -> None:
    from vllm import SamplingParams

    words = [w for w in free[0].outputs[0].text.split() if w.isalpha() and len(w) > 3][:2]
    assert words
    a, b = run_both(engines, prompts, SamplingParams(temperature=0, max_tokens=32, bad_words=words))
    assert ids(b) == ids(a)
    assert ids(a) != ids(free), "the bad words changed nothing: the row would not test them"


def test_per_request_seed_repeats_in_any_batch(engines, prompts) -> None:
    """A seeded request gives the same sample alone, again, and batched with other requests (seeded or
    not); another seed gives another sample."""
    from vllm import SamplingParams

    ours = engines[1]
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7, max_tokens=24)
    alone = ids(ours.generate(prompts[:1], seeded, use_tqdm=False))[0]
    again = ids(ours.generate(prompts[:1], seeded, use_tqdm=False))[0]
    batch = ids(ours.generate([prompts[1], prompts[0], prompts[0]],
                              [SamplingParams(temperature=1.0, max_tokens=24), seeded,
                               SamplingParams(temperature=1.0, top_p=0.95, seed=8, max_tokens=24)], use_tqdm=False))
    assert again == alone
    assert batch[1] == alone
    assert batch[2] != alone


# --- prefix caching -----------------------------------------------------------------------------------------

def _long_context() -> str:
    """~530 tokens of held-out questions: a shared prefix of four KV blocks (the chat prompt around it
    stays within the small engine's 640 tokens with 32 new ones and the K lookahead)."""
    questions = read_user_messages(EVAL_PROMPTS)[:30]
    return "Here are questions people asked:\n" + "\n".join(f"{i + 1}. {q}" for i, q in enumerate(questions))


def test_prefix_caching_hits_and_outputs_identical(engines, smollm2, tokenizer) -> None:
    from vllm import SamplingParams

    context = _long_context()
    ps = chat_prompts(smollm2, [f"{context}\n\nWhich of these questions is about Python decorators?",
                                f"{context}\n\nWhich of these questions is about the weather?"])
    assert len(tokenizer(ps[0], add_special_tokens=False)["input_ids"]) > 4 * BLOCK
    params = SamplingParams(temperature=0, max_tokens=24)
    plain, ours = engines
    first = ours.generate(ps[:1], params, use_tqdm=False)
    second = ours.generate(ps[1:], params, use_tqdm=False)  # shares the context's blocks
    repeat = ours.generate(ps[:1], params, use_tqdm=False)  # the whole prompt's full blocks cached
    # under EAGLE-style speculation vLLM recomputes the last matched block (the drafter needs its states)
    assert second[0].num_cached_tokens >= 3 * BLOCK
    assert repeat[0].num_cached_tokens >= 3 * BLOCK
    reference = ids(plain.generate(ps, params, use_tqdm=False))
    assert ids(first + second) == reference
    assert ids(repeat) == reference[:1]
    assert request_spec_figures(first + second + repeat).drafts > 0


# --- chunked prefill, preemption (one small p_eagle engine) -------------------------------------------------

def _metric(llm, name: str) -> float:
    """A counter from LLM.get_metrics(). vLLM's Prometheus registry is process-wide: it holds the series of
    the engine built last, so read it only on that engine."""
    return sum(float(m.value) for m in llm.get_metrics() if m.name == name)


class TestSmallEngine:
    """A p_eagle engine with a 64-token step budget (long prompts are prefilled in chunks) and a KV cache of
    5 blocks of 128 tokens (concurrent requests do not fit and are preempted)."""

    @pytest.fixture(scope="class")
    def small(self, smollm2, engines):
        llm = make_llm(str(smollm2), SPEC, max_model_len=SMALL_BLOCKS * BLOCK, max_num_batched_tokens=64,
                       num_gpu_blocks_override=SMALL_BLOCKS + 1, max_num_seqs=8,
                       per_request_spec_decode_metrics="summary")
        yield llm
        close_llm(llm)

    def test_chunked_prefill_long_prompt_identical(self, small, engines, smollm2, tokenizer) -> None:
        from vllm import SamplingParams

        [prompt] = chat_prompts(smollm2, [f"{_long_context()}\n\nWhich of these questions is about Python decorators?"])
        assert len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) > 8 * 64  # prefilled in > 8 chunks
        params = SamplingParams(temperature=0, max_tokens=32)
        before = proposals(small)
        out = small.generate([prompt], params, use_tqdm=False)
        assert proposals(small) > before and request_spec_figures(out).drafts > 0
        assert ids(out) == ids(engines[0].generate([prompt], params, use_tqdm=False))

    def test_preemption_under_a_small_kv_cache_identical(self, small, engines, smollm2, tokenizer) -> None:
        from vllm import SamplingParams

        messages = read_user_messages(EVAL_PROMPTS)
        contents = [tokenizer.decode(tokenizer(" ".join(messages[8 * i:8 * i + 8]))["input_ids"][:72])
                    for i in range(6)]
        ps = chat_prompts(smollm2, contents)  # ~103 tokens each
        lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in ps]
        # each prompt fits one block with its K lookahead, and needs a second one within 40 tokens
        assert all(BLOCK - 40 < n < BLOCK - 9 for n in lengths), lengths
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        before = _metric(small, "vllm:num_preemptions")
        out = small.generate(ps, params, use_tqdm=False)
        assert _metric(small, "vllm:num_preemptions") > before, "no request was preempted"
        assert request_spec_figures(out).drafts > 0
        assert ids(out) == ids(engines[0].generate(ps, params, use_tqdm=False))


# --- LoRA ---------------------------------------------------------------------------------------------------

def _tiny_lora(path: Path, rank: int = 8) -> Path:
    """A random rank-8 LoRA adapter on SmolLM2's q_proj/v_proj, in PEFT's layout (no peft needed)."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(30):
        for name, width in (("q_proj", 576), ("v_proj", 192)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, 576, generator=gen) * 0.05
            tensors[f"{key}.lora_B.weight"] = torch.randn(width, rank, generator=gen) * 0.05
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"],
        "bias": "none", "lora_dropout": 0.0, "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "SmolLM2-135M-Instruct"}))
    return path


def test_lora_adapter_greedy_identical(engines, prompts, free, smollm2, tmp_path) -> None:
    """enable_lora with p_eagle: a request with a LoRA adapter equals the plain LoRA engine's output (the
    drafts come from the base model's embedding and the adapted target's states), one without equals the
    base model's."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    adapter = LoRARequest("tiny", 1, str(_tiny_lora(tmp_path / "lora")))
    params = SamplingParams(temperature=0, max_tokens=16)
    lora_kwargs = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    ours = make_llm(str(smollm2), SPEC, per_request_spec_decode_metrics="summary", **lora_kwargs)
    try:
        with_adapter = ours.generate(prompts, params, lora_request=adapter, use_tqdm=False)
        without = ours.generate(prompts, params, use_tqdm=False)
    finally:
        close_llm(ours)
    plain = make_llm(str(smollm2), None, **lora_kwargs)
    try:
        reference = plain.generate(prompts, params, lora_request=adapter, use_tqdm=False)
    finally:
        close_llm(plain)
    assert request_spec_figures(with_adapter).drafts > 0
    assert ids(with_adapter) == ids(reference)
    assert ids(without) == [[c[:16] for c in r] for r in ids(free)]
    assert ids(reference) != ids(without), "the adapter changed nothing: the row would not test it"
