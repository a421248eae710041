"""Soak test: the load of tests/server/test_load.py for a fixed wall time. Starts a p_eagle server and a
server without speculation, sends streaming greedy completions from `--concurrency` clients for `--seconds`
(prompts from a few tokens to nearly the context, stop strings, `--cancel-fraction` cancelled mid-stream),
replays every answered request against the no-speculation server, and prints the figures. Exits 1 on any
error, output mismatch or KV cache not released; the servers are stopped either way.

    .venv/bin/python scripts/soak.py --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from peagle_vllm.harness.load import HeldOutText, plan_requests, replay, run_load
from peagle_vllm.harness.server_process import ServerConfig, metric, peak_during, running_servers, wait_until_idle

REPO = Path(__file__).resolve().parent.parent
KV = "vllm:kv_cache_usage_perc"


def main() -> int:
    """Runs the soak and prints its figures; the exit status says whether it passed."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600.0, help="wall time during which requests are started")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens of the p_eagle server")
    p.add_argument("--max-tokens", type=int, default=64, help="each request's max_tokens is drawn from 1..this")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=120.0, help="per-request limit; a request over it is an error")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default=str(REPO / "models" / "demo-target"))
    p.add_argument("--draft", default=str(REPO / "models" / "demo-peagle-depth"))
    p.add_argument("--log-dir", help="where the two server logs go (default: a new temporary directory)")
    args = p.parse_args()

    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="peagle-soak-"))
    spec = {"method": "p_eagle", "model": str(Path(args.draft).resolve()), "num_speculative_tokens": args.k}
    target = Path(args.target).resolve()
    print(f"starting servers (logs in {logs})", flush=True)
    with running_servers(ServerConfig(target, logs / "p_eagle.log", max_model_len=args.max_model_len,
                                      speculative_config=spec),
                         ServerConfig(target, logs / "no_spec.log", max_model_len=args.max_model_len)) as (ours, plain):
        requests = plan_requests(HeldOutText(target), seed=args.seed, max_model_len=args.max_model_len,
                                 max_tokens=(1, args.max_tokens), cancel_fraction=args.cancel_fraction)
        kv_before = metric(ours.base_url, KV)
        result, kv_peak = asyncio.run(peak_during(ours.base_url, KV, run_load(
            ours.base_url, "demo", requests, concurrency=args.concurrency, timeout_s=args.timeout,
            deadline_s=args.seconds, progress=True)))
        after = wait_until_idle(ours.base_url)
        mismatches = asyncio.run(replay(plain.base_url, "demo", result, concurrency=args.concurrency,
                                        timeout_s=args.timeout, progress=True))

    long_prompts = sum(result.requests[i].prompt_tokens > 1500 for i in result.completed)
    kv_released = after[KV] == kv_before
    print(f"wall time            {result.wall_s:.0f} s (K={args.k}, concurrency {args.concurrency})")
    print(f"requests sent        {result.sent}")
    print(f"completed            {len(result.completed)} ({long_prompts} with prompts over 1500 tokens)")
    print(f"cancelled mid-stream {len(result.cancelled)} ({len(result.cancelled) / max(result.sent, 1):.1%})")
    print(f"errors               {len(result.errors)}")
    print(f"mismatches           {len(mismatches)} (of {len(result.completed) + len(result.cancelled)} replayed)")
    print(f"KV cache usage       before {kv_before:.4f}, peak {kv_peak:.4f}, after {after[KV]:.4f}"
          f" ({'released' if kv_released else 'NOT released'})")
    print(f"preemptions          {after['vllm:num_preemptions_total']:.0f}")
    print(f"latency              p50 {result.p50_s:.2f} s, p99 {result.p99_s:.2f} s")
    for i, error in sorted(result.errors.items())[:20]:
        print(f"error: {result.requests[i].describe()}: {error}")
    for m in mismatches[:20]:
        print(f"mismatch: {m.describe()}")
    return 0 if not result.errors and not mismatches and kv_released else 1


if __name__ == "__main__":
    sys.exit(main())
