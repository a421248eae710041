"""A pass over SmolLM2-135M's 30 layers' linears (vLLM's onednn_mm, float32, random weights of the model's shapes)
and over its output layer, timed by the number of tokens M: what verifying more drafts costs in matmuls alone.

    .venv/bin/python results/profile-smollm2/draft-split-s69/mm_by_m.py
"""
import statistics
import time

import torch
from vllm import _custom_ops as ops

torch.set_num_threads(2)
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # (in, out): qkv, o_proj, gate_up, down
layers = [[(ops.create_onednn_mm((torch.randn(n, k) * 0.02).t(), 32), k) for k, n in SHAPES] for _ in range(30)]
lm_head = ops.create_onednn_mm((torch.randn(49152, 576) * 0.02).t(), 32)


def one_pass(m: int) -> None:
    for handlers in layers:
        for handler, k in handlers:
            ops.onednn_mm(handler, torch.randn(m, k), None)


SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16)
body, head = {m: [] for m in SIZES}, {m: [] for m in SIZES}
for _ in range(7):
    for m in SIZES:
        start = time.perf_counter()
        one_pass(m)
        body[m].append(time.perf_counter() - start)
        x = torch.randn(m, 576)
        start = time.perf_counter()
        ops.onednn_mm(lm_head, x, None)
        head[m].append(time.perf_counter() - start)
for m in SIZES:
    print(f"M={m:2d}  layers' linears {statistics.median(body[m]) * 1000:7.2f} ms   "
          f"lm_head {statistics.median(head[m]) * 1000:6.2f} ms")
