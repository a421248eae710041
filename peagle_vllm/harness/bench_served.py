"""The served half of `peagle-vllm bench`: each mode behind `peagle-vllm serve` on 127.0.0.1, driven by
streaming OpenAI clients. Per concurrency: output tokens/s, TTFT and TPOT (client-side, per request),
and the acceptance length from the server's own vLLM spec-decode counters."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from peagle_vllm.harness.bench import WARMUP, output_lengths, requests_for
from peagle_vllm.harness.runs import engines_are_eager
from peagle_vllm.harness.server_process import ServerConfig, running_server, scrape_metrics

DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


async def _stream(client, prompt: str, max_tokens: int, temperature: float, top_p: float) -> tuple[float, float, int]:
    """One streamed completion: (seconds to the first token, seconds in all, completion tokens)."""
    start = time.perf_counter()
    first = None
    tokens = 0
    stream = await client.completions.create(model="demo", prompt=prompt, max_tokens=max_tokens,
                                             temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                             stream=True,
                                             stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    total = time.perf_counter() - start
    return (first if first is not None else total), total, tokens


async def _clients(base_url: str, prompts: list[str], concurrency: int, max_tokens: int, temperature: float,
                   range_ratio: float, top_p: float) -> tuple[list[tuple[float, float, int]], float]:
    """The cell's requests (`requests_for`, each emitting its `output_lengths` tokens) with at most `concurrency`
    in flight, each client sending its next one as soon as the last ends; their (TTFT, latency, tokens) and the
    wall time of all."""
    from openai import AsyncOpenAI

    slots = asyncio.Semaphore(concurrency)

    async def one(client, prompt: str, length: int) -> tuple[float, float, int]:
        async with slots:
            return await _stream(client, prompt, length, temperature, top_p)

    requests = requests_for(prompts, concurrency)
    lengths = output_lengths(len(requests), max_tokens, range_ratio)
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, p, n) for p, n in zip(requests, lengths)))
        return list(results), time.perf_counter() - t0


def measure(base_url: str, prompts: list[str], concurrency: int, max_tokens: int, temperature: float,
            range_ratio: float = 0.0, top_p: float = 1.0) -> dict:
    """The cell's streamed requests: throughput, mean TTFT/TPOT and the acceptance length they saw."""
    before = scrape_metrics(base_url)
    results, wall = asyncio.run(_clients(base_url, prompts, concurrency, max_tokens, temperature, range_ratio, top_p))
    after = scrape_metrics(base_url)
    drafts = after.get(DRAFTS, 0.0) - before.get(DRAFTS, 0.0)
    accepted = after.get(ACCEPTED, 0.0) - before.get(ACCEPTED, 0.0)
    tokens = sum(n for _, _, n in results)
    tpots = [(total - ttft) / (n - 1) for ttft, total, n in results if n > 1]
    return {"tokens_per_s": tokens / wall, "seconds": wall,
            "acceptance_length": 1.0 + accepted / drafts if drafts else 1.0, "per_position": [],
            "ttft_ms": 1e3 * statistics.mean(t for t, _, _ in results),
            "tpot_ms": 1e3 * statistics.mean(tpots) if tpots else None}


def run_mode(target: Path, spec: dict | None, prompts: list[str], concurrencies: list[int], temperatures: list[float],
             max_tokens: int, range_ratio: float, on_row, top_p: float = 1.0) -> None:
    """Starts one server for `spec` (None: no speculation), warms it up, measures every concurrency and
    temperature, and hands each figure dict to `on_row(concurrency, temperature, figures)`."""
    with tempfile.TemporaryDirectory() as logs:
        config = ServerConfig(target, Path(logs) / "server.log", max_model_len=1024, speculative_config=spec,
                              enforce_eager=engines_are_eager(),
                              extra_args=("--max-num-seqs", str(max(concurrencies)), "--no-enable-prefix-caching"))
        with running_server(config) as server:
            measure(server.base_url, prompts, *WARMUP, 0.0)
            for temperature in temperatures:
                for conc in concurrencies:
                    on_row(conc, temperature,
                           measure(server.base_url, prompts, conc, max_tokens, temperature, range_ratio, top_p))
