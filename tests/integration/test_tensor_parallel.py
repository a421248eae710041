"""p_eagle under vLLM's tensor parallelism on the CPU backend: TP=2 outputs equal TP=1 (head replicated
across ranks where small, sharded where vLLM's parallel layers shard it: attention, MLP, vocab)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    target, head, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = LLM(target, dtype="float32", enforce_eager=True, max_model_len=512, tensor_parallel_size=tp,
              speculative_config={"method": "p_eagle", "model": head, "num_speculative_tokens": 8})
    out = llm.generate(["def f1(x):\\n", "x = 2\\n", "class A:\\n"],
                       SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
    print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in out]))
"""


def _run(tiny, tp: int) -> list[list[int]]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1" if tp == 2 else "0"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny["target"]), str(tiny["depth"]), str(tp)],
                         capture_output=True, text=True, timeout=400, env=env)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, run.stdout[-2000:] + run.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_tp2_outputs_equal_tp1(tiny) -> None:
    assert _run(tiny, 2) == _run(tiny, 1)
