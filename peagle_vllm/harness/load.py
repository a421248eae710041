"""Load against a running OpenAI-compatible server: many concurrent streaming greedy completions over
held-out text (a few tokens up to nearly the context), some with stop strings, some cancelled mid-stream;
and a replay of the same requests against a second server to compare the generated text.

Everything is deterministic given the seed: the prompts, their lengths, `max_tokens`, stop strings and
which requests are cancelled after how many chunks.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import re
import time
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from peagle_vllm.harness.corpus import corpus_files, read_text

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# (share of requests, shortest, longest prompt in tokens); None = max_model_len - max_tokens
LENGTH_MIX: tuple[tuple[float, int, int | None], ...] = ((0.2, 2, 16), (0.4, 16, 512), (0.2, 512, 1500),
                                                         (0.2, 1500, None))
STOP_STRINGS: tuple[tuple[str, ...], ...] = (("\n",), ("return",), ("\n\n",), (")",), ("=", ":"), ("self",))
CANCEL_BLOCK = 20  # exactly round(CANCEL_BLOCK * cancel_fraction) requests of every block of 20 are cancelled
CLIENT_TIMEOUT_SLACK_S = 30.0  # the per-request asyncio timeout fires first, so a hang is reported as one


@dataclass(frozen=True)
class LoadRequest:
    """One planned completion request: greedy, streamed; cancelled after `cancel_after_chunks` if set."""

    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stop: tuple[str, ...] | None
    cancel_after_chunks: int | None

    def describe(self) -> str:
        """A one-line summary for failure messages."""
        return (f"request {self.index}: prompt {self.prompt_tokens} tokens, max_tokens {self.max_tokens}, "
                f"stop {list(self.stop) if self.stop else None}, cancel after {self.cancel_after_chunks} chunks")


class HeldOutText:
    """The held-out corpus files, tokenized once, cut into prompts of a chosen token length."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.texts = [read_text(f) for f in corpus_files("held_out")]
        enc = self.tokenizer(self.texts, add_special_tokens=False, return_offsets_mapping=True)
        self.starts = [[a for a, _ in offsets] for offsets in enc["offset_mapping"]]
        self.ends = [[b for _, b in offsets] for offsets in enc["offset_mapping"]]
        self.line_starts = [[0] + [m.end() for m in re.finditer("\n", t)] for t in self.texts]

    def count(self, text: str) -> int:
        """Prompt tokens as the server counts them (special tokens included)."""
        return len(self.tokenizer(text)["input_ids"])

    def prompt(self, rng: random.Random, tokens: int) -> tuple[str, int]:
        """Held-out text starting at a line start, about `tokens` long and never longer; (text, token count)."""
        files = [i for i, s in enumerate(self.starts) if len(s) > tokens + 1]
        f = rng.choice(files)
        text, starts, ends, lines = self.texts[f], self.starts[f], self.ends[f], self.line_starts[f]
        line_start = lines[rng.randrange(bisect.bisect_right(lines, starts[-tokens]))]
        first = bisect.bisect_left(starts, line_start)
        last = first + tokens - 1
        while True:  # re-tokenizing a cut can merge or split at the edges; shorten until it fits
            prompt = text[starts[first]: ends[last]]
            n = self.count(prompt)
            if n <= tokens or last == first:
                return prompt, n
            last = max(first, last - (n - tokens))


def plan_requests(text: HeldOutText, *, seed: int, max_model_len: int, max_tokens: tuple[int, int] = (1, 64),
                  cancel_fraction: float = 0.2, stop_fraction: float = 0.25) -> Iterator[LoadRequest]:
    """An endless, seed-determined stream of requests whose prompt + max_tokens fits in `max_model_len`."""
    lo, hi = max_tokens
    n_cancel = round(CANCEL_BLOCK * cancel_fraction)
    weights = [w for w, _, _ in LENGTH_MIX]
    index = 0
    while True:
        block = index // CANCEL_BLOCK
        cancelled = set(random.Random(f"{seed}/cancel/{block}").sample(range(CANCEL_BLOCK), n_cancel))
        for _ in range(CANCEL_BLOCK):
            rng = random.Random(f"{seed}/{index}")
            cancel = index % CANCEL_BLOCK in cancelled
            # a cancelled request gets room for several chunks so that closing the stream cuts it mid-way
            n_out = rng.randint(max(lo, (lo + hi) // 2), hi) if cancel else rng.randint(lo, hi)
            _, shortest, longest = rng.choices(LENGTH_MIX, weights)[0]
            budget = max_model_len - n_out
            prompt, n = text.prompt(rng, rng.randint(min(shortest, budget), min(longest or budget, budget)))
            stop = rng.choice(STOP_STRINGS) if not cancel and rng.random() < stop_fraction else None
            yield LoadRequest(index, prompt, n, n_out, stop, rng.randint(1, 3) if cancel else None)
            index += 1


@dataclass(frozen=True)
class Completion:
    """A stream that ran to its end."""

    text: str
    finish_reason: str
    latency_s: float
    chunks: int


@dataclass
class LoadResult:
    """What a load run sent and got back, by request index."""

    requests: dict[int, LoadRequest] = field(default_factory=dict)
    completed: dict[int, Completion] = field(default_factory=dict)
    cancelled: dict[int, str] = field(default_factory=dict)  # text received before the stream was closed
    errors: dict[int, str] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def sent(self) -> int:
        """Requests sent."""
        return len(self.requests)

    def latency_percentile(self, q: float) -> float:
        """Nearest-rank percentile (0..100) of completed requests' end-to-end latency, in seconds."""
        lat = sorted(c.latency_s for c in self.completed.values())
        return lat[max(0, math.ceil(q / 100 * len(lat)) - 1)] if lat else float("nan")

    @property
    def p50_s(self) -> float:
        """Median latency of completed requests."""
        return self.latency_percentile(50)

    @property
    def p99_s(self) -> float:
        """99th-percentile latency of completed requests."""
        return self.latency_percentile(99)


async def _stream_one(client: AsyncOpenAI, model: str, req: LoadRequest) -> Completion | str:
    """Streams one request; a Completion, or the partial text if it was cancelled as planned."""
    start = time.perf_counter()
    parts: list[str] = []
    finish: str | None = None
    chunks = 0
    stream = await client.completions.create(model=model, prompt=req.prompt, max_tokens=req.max_tokens,
                                             temperature=0, stop=list(req.stop) if req.stop else None, stream=True)
    async with stream:
        async for chunk in stream:
            chunks += 1
            if chunk.choices:
                parts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            if req.cancel_after_chunks is not None and finish is None and chunks >= req.cancel_after_chunks:
                return "".join(parts)
    if finish not in ("stop", "length"):
        raise RuntimeError(f"stream ended with finish_reason {finish!r}")
    return Completion("".join(parts), finish, time.perf_counter() - start, chunks)


async def run_load(base_url: str, model: str, requests: Iterable[LoadRequest], *, concurrency: int = 64,
                   timeout_s: float = 120.0, deadline_s: float | None = None, progress: bool = False) -> LoadResult:
    """Sends `requests`, at most `concurrency` at once, none after `deadline_s`; failures and hangs are recorded."""
    from openai import AsyncOpenAI

    result = LoadResult()
    pending = iter(requests)
    start = time.monotonic()
    bar = tqdm(total=len(requests) if isinstance(requests, Sized) else None, desc="load", unit="req",
               disable=not progress)

    async def worker(client: AsyncOpenAI) -> None:
        while deadline_s is None or time.monotonic() - start < deadline_s:
            req = next(pending, None)
            if req is None:
                return
            result.requests[req.index] = req
            try:
                async with asyncio.timeout(timeout_s):
                    outcome = await _stream_one(client, model, req)
            except TimeoutError:
                result.errors[req.index] = f"no answer in {timeout_s:.0f} s (hung)"
            except Exception as e:  # noqa: BLE001 - every failure is a finding of the load run
                result.errors[req.index] = f"{type(e).__name__}: {e}"
            else:
                if isinstance(outcome, Completion):
                    result.completed[req.index] = outcome
                else:
                    result.cancelled[req.index] = outcome
            bar.update()
            bar.set_postfix(cancelled=len(result.cancelled), errors=len(result.errors), refresh=False)

    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                           timeout=timeout_s + CLIENT_TIMEOUT_SLACK_S) as client:
        async with asyncio.TaskGroup() as tasks:
            for _ in range(concurrency):
                tasks.create_task(worker(client))
    bar.close()
    result.wall_s = time.monotonic() - start
    return result


@dataclass(frozen=True)
class Mismatch:
    """A request whose output on the server under test differs from the reference server's."""

    request: LoadRequest
    got: str
    expected: str
    got_finish: str | None  # None: a cancelled stream, whose text must be a prefix of the reference
    expected_finish: str

    def describe(self) -> str:
        """Which request and where the two texts part."""
        at = next((i for i, (a, b) in enumerate(zip(self.got, self.expected)) if a != b),
                  min(len(self.got), len(self.expected)))
        window = slice(max(0, at - 20), at + 40)
        return (f"{self.request.describe()}: differs at char {at} "
                f"(got {len(self.got)} chars, finish {self.got_finish}; reference {len(self.expected)} chars, "
                f"finish {self.expected_finish}): got {self.got[window]!r}, reference {self.expected[window]!r}")


async def replay(base_url: str, model: str, result: LoadResult, *, concurrency: int = 64,
                 timeout_s: float = 120.0, progress: bool = False) -> list[Mismatch]:
    """Re-sends `result`'s answered requests to a reference server: completed must equal, cancelled be a prefix."""
    from openai import AsyncOpenAI

    mismatches: list[Mismatch] = []
    indices = sorted([*result.completed, *result.cancelled])
    limit = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(indices), desc="replay", unit="req", disable=not progress)

    async def one(client: AsyncOpenAI, i: int) -> None:
        req = result.requests[i]
        async with limit:
            async with asyncio.timeout(timeout_s):
                ref = (await client.completions.create(model=model, prompt=req.prompt, max_tokens=req.max_tokens,
                                                       temperature=0,
                                                       stop=list(req.stop) if req.stop else None)).choices[0]
        bar.update()
        if i in result.completed:
            got = result.completed[i]
            if got.text != ref.text or got.finish_reason != ref.finish_reason:
                mismatches.append(Mismatch(req, got.text, ref.text, got.finish_reason, ref.finish_reason))
        elif not ref.text.startswith(result.cancelled[i]):
            mismatches.append(Mismatch(req, result.cancelled[i], ref.text, None, ref.finish_reason))

    async with AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                           timeout=timeout_s + CLIENT_TIMEOUT_SLACK_S) as client:
        async with asyncio.TaskGroup() as tasks:
            for i in indices:
                tasks.create_task(one(client, i))
    bar.close()
    return sorted(mismatches, key=lambda m: m.request.index)
