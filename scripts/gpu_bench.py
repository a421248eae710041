"""Standalone draft-cost benchmark at real sizes: needs torch (and a GPU for real figures), no vLLM, no
model files (random weights). One decode step of the P-EAGLE head (K query slots over a cached context,
ONE forward) vs sequential EAGLE-3 drafting (K forwards of one slot), and the verifier at B x K,
each beside its roofline floor (bytes moved / bandwidth, FLOPs / peak); then the batch prompt lookup of vLLM 0.34's
adapter (`peagle_vllm/batch_lookup.py`) over token histories of max_model_len tokens, and its corpus walk
(`peagle_vllm/corpus_table.py`) over a table of SmolLM2's corpus (`datasets/smollm2`), eager as the adapter runs it.

    python scripts/gpu_bench.py                 # H100/H200-sized defaults, CUDA graphs
    python scripts/gpu_bench.py --device cpu --hidden 256 --vocab 4096 --draft-vocab 2048 --batches 1 4 --context 256

`python scripts/gpu_bench.py engine` measures whole engines instead (needs vLLM; `peagle_vllm/harness/engine_bench.py`):
p_eagle against vLLM's own speculative methods and no speculation on a random-weight target of real shape,
with forced acceptance (`--forced`) or random heads:

    python scripts/gpu_bench.py engine --shape llama-3.1-8b --forced --out gpu-bench   # ~5 min on one H100/H200
    python scripts/gpu_bench.py engine --shape tiny --ks 4 --concurrency 1 4 --tokens 32 --dtype float32   # CPU check
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from peagle_vllm.batch_lookup import prompt_lookup  # noqa: E402
from peagle_vllm.corpus_lookup import CorpusLookup, read_answers  # noqa: E402
from peagle_vllm.corpus_table import CorpusTable  # noqa: E402
from peagle_vllm.head import HeadConfig, PEagleHead, rotary  # noqa: E402
from peagle_vllm.verify import target_probs, verify  # noqa: E402

PEAK = {"cuda": (4.8e12, 9.9e14), "cpu": (5e10, 1e11)}  # (bytes/s, FLOP/s): H200 HBM3e, bf16 dense


class DecodeStep(torch.nn.Module):
    """One head forward for `slots` new query slots per request over a cached context of C keys.

    The slots' keys and values are written into the cache in place and attention is lower-right causal (each slot
    sees the context and the slots before it) with no materialized mask, so SDPA can pick a flash kernel, as vLLM's
    attention backends do; a boolean mask or a cache rebuilt by concatenation would time the math kernel and a copy.
    """

    def __init__(self, head: PEagleHead, batch: int, context: int, slots: int) -> None:
        super().__init__()
        cfg, dev, dt = head.cfg, head.fc.weight.device, head.fc.weight.dtype
        self.head = head
        # k_cache, v_cache: [batch, kv_heads, context + slots, head_dim]; the last `slots` rows are this step's
        self.k_cache = torch.randn(batch, cfg.num_key_value_heads, context + slots, cfg.head_dim, device=dev, dtype=dt)
        self.v_cache = torch.randn_like(self.k_cache)
        self.ids = torch.randint(0, cfg.vocab_size, (batch, slots), device=dev)  # [batch, slots]
        self.aux = torch.randn(batch, slots, 3 * cfg.hidden_size, device=dev, dtype=dt)  # [batch, slots, 3 * hidden]
        self.positions = torch.arange(context, context + slots, device=dev).expand(batch, -1)  # [batch, slots]
        self.causal = causal_lower_right(slots, context + slots)
        self.layer = head.layers[0]

    def attention(self, q: torch.Tensor) -> torch.Tensor:
        """q: [batch, heads, slots, head_dim] over the cache -> [batch, heads, slots, head_dim]."""
        return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=self.causal, enable_gqa=True)

    def forward(self) -> torch.Tensor:
        head, layer, cfg = self.head, self.layer, self.head.cfg
        b, s = self.ids.shape
        hidden = head.combine_hidden_states(self.aux)
        x = torch.cat([layer.input_layernorm(head.embed_tokens(self.ids)), layer.hidden_norm(hidden)], dim=-1)
        attn = layer.self_attn
        q = rotary(attn.q_proj(x).view(b, s, cfg.num_attention_heads, cfg.head_dim), self.positions, cfg.rope_theta)
        k = rotary(attn.k_proj(x).view(b, s, cfg.num_key_value_heads, cfg.head_dim), self.positions, cfg.rope_theta)
        v = attn.v_proj(x).view(b, s, cfg.num_key_value_heads, cfg.head_dim)
        self.k_cache[:, :, -s:] = k.transpose(1, 2)
        self.v_cache[:, :, -s:] = v.transpose(1, 2)
        out = self.attention(q.transpose(1, 2))
        residual = attn.o_proj(out.transpose(1, 2).reshape(b, s, -1)) + hidden
        residual = layer.mlp(layer.post_attention_layernorm(residual)) + residual
        return head.draft_logits(head.norm(residual)).argmax(-1)

    def attention_kernel(self) -> str:
        """The first of SDPA's kernels (flash, memory-efficient, math) that runs this step's attention."""
        q = torch.randn(*self.ids.shape, self.head.cfg.num_attention_heads, self.head.cfg.head_dim,
                        device=self.k_cache.device, dtype=self.k_cache.dtype).transpose(1, 2)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
            try:
                with sdpa_kernel(backend):
                    self.attention(q)
                return backend.name.lower()
            except RuntimeError:
                continue
        return "none"


def capture(fn):
    """fn captured in a CUDA graph after warm-up on a side stream -> (graph.replay, the captured call's output)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def median_seconds(call, device: str, reps: int = 20) -> float:
    """Median wall seconds of `call` after 3 warm-up calls, the device synchronized around each."""
    for _ in range(3):
        call()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def timed(fn, device: str, graphs: bool, reps: int = 20) -> float:
    """Median seconds per call (CUDA graph replay on GPU when asked)."""
    call = capture(fn)[0] if device == "cuda" and graphs else fn
    return median_seconds(call, device, reps)


def floor(cfg: HeadConfig, batch: int, slots: int, context: int, device: str, elem: int) -> float:
    """Roofline floor of one head forward: weights + KV read once, 2 FLOPs per weight per slot."""
    h, i, vd = cfg.hidden_size, cfg.intermediate_size, cfg.draft_vocab_size
    weights = 3 * h * h + 2 * h * 3 * h + h * h + 3 * h * i + vd * h
    kv = batch * context * 2 * cfg.num_key_value_heads * cfg.head_dim
    flops = 2 * weights * batch * slots + 4 * batch * slots * (context + slots) * h
    bw, peak = PEAK[device]
    return max((weights + kv) * elem / bw, flops / peak)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=200_000)
    p.add_argument("--draft-vocab", type=int, default=32_000)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--batches", type=int, nargs="*", default=[1, 4, 16, 64])
    p.add_argument("--ks", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--lookup-lengths", type=int, nargs="*", default=[8192, 32768, 131072],
                   help="max_model_len values for the batch prompt lookup's timing (vLLM 0.34's token history width)")
    p.add_argument("--corpus", type=Path, default=REPO / "datasets" / "smollm2",
                   help="answers (`peagle-vllm distill` output) for the corpus walk's timing")
    p.add_argument("--corpus-ks", type=int, nargs="*", default=[4, 8])
    args = p.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    elem = 2 if dtype == torch.bfloat16 else 4
    cfg = HeadConfig(hidden_size=args.hidden, vocab_size=args.vocab, draft_vocab_size=args.draft_vocab,
                     intermediate_size=int(args.hidden * 2.75) // 64 * 64, num_attention_heads=args.heads,
                     num_key_value_heads=args.kv_heads, aux_layer_ids=[2, 16, 29], mask_token_id=0,
                     variant="depth", trained_depth=32, fc_norm=True, norm_output=True)
    head = PEagleHead(cfg).to(dev, dtype).eval()
    print(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), hidden {args.hidden}, "
          f"draft vocab {args.draft_vocab}, target vocab {args.vocab}, context {args.context}, {dtype}")
    with torch.inference_mode():
        kernels = {k: DecodeStep(head, 1, args.context, k).attention_kernel() for k in (1, max(args.ks))}
    print(f"SDPA kernel: {kernels[1]} at 1 slot, {kernels[max(args.ks)]} at {max(args.ks)} slots\n")
    print("| batch | K | P-EAGLE (1 forward) ms | floor ms | EAGLE-3 (K forwards) ms | floor ms | ratio |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for b in args.batches:
            for k in args.ks:
                par = timed(DecodeStep(head, b, args.context, k), dev, not args.no_graphs)
                one = timed(DecodeStep(head, b, args.context, 1), dev, not args.no_graphs)
                seq = k * one  # each sequential step is a one-slot forward over a context grown by one
                print(f"| {b} | {k} | {par * 1e3:.3f} | {floor(cfg, b, k, args.context, dev, elem) * 1e3:.3f} | "
                      f"{seq * 1e3:.3f} | {k * floor(cfg, b, 1, args.context, dev, elem) * 1e3:.3f} | {seq / par:.2f}x |")
        print("\n| batch x K | verify greedy ms | verify sampled ms | floor ms |")
        print("|---|---|---|---|")
        for b in args.batches:
            k = 32
            logits = torch.randn(b * k, args.vocab, device=dev)
            probs = target_probs(logits, torch.ones(b * k, device=dev)).view(b, k, -1)
            argmax = probs.argmax(-1)
            q = torch.softmax(torch.randn(b, k, args.vocab, device=dev), -1)
            bonus, num = torch.zeros(b, dtype=torch.long, device=dev), torch.full((b,), k, device=dev)
            g = timed(lambda: verify("standard", argmax, num, None, None, argmax, bonus,  # all greedy: no probs
                                     torch.ones(b, dtype=torch.bool, device=dev)), dev, False)
            s = timed(lambda: verify("standard", argmax, num, q, probs, argmax, bonus,
                                     torch.zeros(b, dtype=torch.bool, device=dev)), dev, False)
            bw = PEAK[dev][0]
            print(f"| {b} x {k} | {g * 1e3:.3f} | {s * 1e3:.3f} | {2 * b * k * args.vocab * 4 / bw * 1e3:.3f} |")
        print("\n| batch | max_model_len | prompt lookup ms (K=8, n-grams 2-5, every row full) |")
        print("|---|---|---|")
        for b in args.batches:
            for width in args.lookup_lengths:
                history = torch.randint(0, 1000, (b, width), dtype=torch.int32, device=dev)
                rows, lengths = torch.arange(b, device=dev), torch.full((b,), width, device=dev)
                t = timed(lambda: prompt_lookup(history, rows, lengths, 8, 2, 5), dev, False)
                print(f"| {b} | {width} | {t * 1e3:.3f} |")
        answers = read_answers(args.corpus)
        lookup = CorpusLookup(answers)
        table = CorpusTable.of(lookup).to(dev)
        print(f"\n| batch | K | corpus walk ms ({lookup.tokens} tokens, {table.nbytes / 2**20:.0f} MiB; each request "
              "at a random point of an answer) |\n|---|---|---|")
        generator = torch.Generator().manual_seed(0)
        for b in args.batches:
            tail = torch.full((b, table.max_n), -1, dtype=torch.long)
            for row in range(b):
                prompt, answer = answers[int(torch.randint(len(answers), (1,), generator=generator))]
                text = (prompt + answer)[: int(torch.randint(1, len(prompt + answer) + 1, (1,), generator=generator))]
                last = text[::-1][: table.max_n]
                tail[row, : len(last)] = torch.tensor(last)
            tail = tail.to(dev)
            for k in args.corpus_ks:
                t = timed(lambda: table.continuation(tail, k), dev, False)
                print(f"| {b} | {k} | {t * 1e3:.3f} |")


def engine_main(argv: list[str]) -> None:
    import json
    import os
    import tempfile

    p = argparse.ArgumentParser(prog="gpu_bench.py engine")
    p.add_argument("--shape", default="llama-3.1-8b", help="llama-3.1-8b | llama-3.2-1b | tiny")
    p.add_argument("--ks", type=int, nargs="*", default=[4, 8, 16, 32])
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 64])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--forced", action="store_true", help="zero the output layers: every draft accepted")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", type=Path, help="directory for bench.json and bench.md")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (--forced reaches it)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from peagle_vllm.harness.engine_bench import markdown, run
    from peagle_vllm.harness.runs import set_cpu_defaults
    from peagle_vllm.vllm_adapter.version import adapter_line, installed_vllm_version

    if not torch.cuda.is_available():
        set_cpu_defaults()  # a small KV cache instead of a share of the machine's memory
    line = adapter_line(installed_vllm_version())
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(Path(tmp), args.shape, line, args.ks, args.concurrency, args.tokens, args.forced, args.dtype)
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps({"shape": args.shape, "vllm_line": line, "forced": args.forced,
                                                         "rows": rows}, indent=1))
        (args.out / "bench.md").write_text(table)


if __name__ == "__main__":
    if sys.argv[1:2] == ["engine"]:
        engine_main(sys.argv[2:])
    else:
        main()
