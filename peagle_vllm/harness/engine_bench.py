"""Engine-level speed of p_eagle against vLLM's own speculative methods and no speculation, on a target of real
shape with random weights (vLLM's `load_format="dummy"`: only a config.json, no model files, no hub) and random
heads of matching shape written here. `--forced` zeroes the target's and the heads' output layers after loading,
so every draft is accepted (token 0 everywhere): the machinery's ceiling, independent of any head's quality.

Modes by vLLM line: 0.32/0.33 (V1 runner) no speculation, vLLM's built-in parallel drafting (standard head),
p_eagle with the standard and the depth-aware head (fixed K); 0.34+ (V2 runner) no speculation, vLLM's EAGLE-3
(sequential, an eagle3 head) and p_eagle (the V2 speculator). Each cell sends 2 x concurrency requests of
`--tokens` tokens (EOS ignored) with at most `concurrency` in flight; the figure is output tokens/s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SHAPES = {  # name -> (hidden, layers, intermediate, heads, kv heads, vocab, head's draft vocab)
    "llama-3.1-8b": (4096, 32, 14336, 32, 8, 128256, 32000),
    "llama-3.2-1b": (2048, 16, 8192, 32, 8, 128256, 32000),
    "tiny": (256, 8, 512, 4, 2, 4096, 1024),  # 8 layers: three distinct auxiliary layers (2, 4, 5)
}


@dataclass(frozen=True)
class EngineMode:
    name: str
    method: str | None  # speculative method; None: no speculation
    head: str | None  # "standard" | "depth" | "eagle3"
    extra: tuple = ()


def modes_for(line: str) -> list[EngineMode]:
    if line == "v1":
        return [EngineMode("no-spec", None, None),
                EngineMode("vllm-parallel", "eagle3", "standard", (("parallel_drafting", True),)),
                EngineMode("p_eagle-standard", "p_eagle", "standard", (("adaptive", False),)),
                EngineMode("p_eagle-depth", "p_eagle", "depth", (("adaptive", False),))]
    return [EngineMode("no-spec", None, None), EngineMode("vllm-eagle3", "eagle3", "eagle3"),
            EngineMode("p_eagle-depth", "p_eagle", "depth")]


def write_target(root: Path, shape: str) -> Path:
    """A Llama config.json of the given shape (weights come from vLLM's dummy loader)."""
    h, layers, inter, heads, kv, vocab, _ = SHAPES[shape]
    out = root / f"target-{shape}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "num_hidden_layers": layers,
        "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    return out


def write_head(root: Path, shape: str, variant: str, k: int) -> Path:
    """A random one-layer head of the target's shape (speculators format), its output layer zeroed so that,
    with the target's zeroed too, every draft is token 0 and accepted (harmless otherwise: weights are random)."""
    from peagle_vllm.checkpoint import save_head
    from peagle_vllm.head import HeadConfig, PEagleHead

    h, layers, inter, heads, kv, vocab, draft_vocab = SHAPES[shape]
    out = root / f"head-{shape}-{variant}-{k}"
    if (out / "config.json").exists():
        return out
    cfg = HeadConfig(hidden_size=h, vocab_size=vocab, draft_vocab_size=draft_vocab, intermediate_size=inter,
                     num_attention_heads=heads, num_key_value_heads=kv, aux_layer_ids=[2, layers // 2, layers - 3],
                     mask_token_id=0, rope_theta=500000.0, max_position_embeddings=4096, variant=variant,
                     trained_depth=max(k, 2), fc_norm=variant == "depth", norm_output=variant == "depth")
    torch.manual_seed(0)
    head = PEagleHead(cfg)
    with torch.no_grad():
        head.lm_head.weight.zero_()
        head.set_vocab_map(torch.arange(draft_vocab))
    save_head(head, out, verifier=f"target-{shape}", dtype=torch.bfloat16, share_embeddings=True)
    return out


def zero_target_output(llm) -> None:
    """Zeroes the loaded target's lm_head (in-process engine), so it always emits token 0."""
    core = llm.llm_engine.engine_core
    executor = getattr(core, "engine_core", core).model_executor
    runner = executor.driver_worker.worker.model_runner
    model = runner.model.get_language_model() if hasattr(runner.model, "get_language_model") else runner.model
    with torch.no_grad():
        model.lm_head.weight.zero_()
        drafter = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)  # V1 / V2 runner
        drafter_model = getattr(drafter, "model", None)
        if drafter_model is not None and hasattr(drafter_model, "lm_head"):
            drafter_model.lm_head.weight.zero_()


def measure(llm, concurrency: int, tokens: int, vocab: int) -> float:
    """Output tokens/s of 2 x concurrency requests (random 64-token prompts) with at most `concurrency` in flight."""
    from vllm import SamplingParams, TokensPrompt

    g = torch.Generator().manual_seed(concurrency)
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(3, vocab, (64,), generator=g).tolist())
               for _ in range(2 * concurrency)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)


def run(root: Path, shape: str, line: str, ks: list[int], concurrencies: list[int], tokens: int, forced: bool,
        dtype: str, log=print) -> list[dict]:
    """One engine per mode and K (max_num_seqs = the largest concurrency), every concurrency measured on it."""
    from vllm import LLM

    from peagle_vllm.harness.runs import close_llm

    target = write_target(root, shape)
    rows = []
    for mode in modes_for(line):
        for k in ([0] if mode.method is None else ks):
            spec = None
            if mode.method is not None:
                spec = {"method": mode.method, "model": str(write_head(root, shape, mode.head, k)),
                        "num_speculative_tokens": k, **dict(mode.extra)}
            llm = LLM(model=str(target), load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                      max_model_len=1024, max_num_seqs=max(concurrencies), speculative_config=spec,
                      enable_prefix_caching=False, seed=0, enforce_eager=not torch.cuda.is_available())
            if forced:
                zero_target_output(llm)
            measure(llm, 1, 16, SHAPES[shape][5])  # warm-up
            for c in concurrencies:
                tps = measure(llm, c, tokens, SHAPES[shape][5])
                rows.append({"mode": mode.name, "k": k, "concurrency": c, "tokens_per_s": round(tps, 1)})
                log(f"{mode.name:18s} K={k:<3d} c={c:<3d} {tps:9.1f} tokens/s")
            close_llm(llm)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    for r in rows:
        base = next(x["tokens_per_s"] for x in rows if x["mode"] == "no-spec" and x["concurrency"] == r["concurrency"])
        r["vs_no_spec"] = round(r["tokens_per_s"] / base, 3)
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| mode | K | concurrency | tokens/s | vs no-spec |\n|---|---|---|---|---|\n"
    return head + "".join(f"| {r['mode']} | {r['k'] or '-'} | {r['concurrency']} | {r['tokens_per_s']} | "
                          f"{r['vs_no_spec']:.2f} |\n" for r in rows)
