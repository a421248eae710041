"""`peagle-vllm serve` on 127.0.0.1 with p_eagle, driven by the real openai client."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from peagle_vllm.harness.runs import generate
from peagle_vllm.harness.server_process import ServerConfig, running_server, scrape_metrics
from peagle_vllm.vllm_adapter.serve import SMALL_MACHINE_CPUS

PROMPT = "import os\nimport sys\n\n\ndef main():\n"
CORPUS_PROMPT = "class Stack:\n    def __init__(self):\n"  # its offline greedy answer is the lookup corpus


@pytest.fixture(scope="module")
def server(demo, tmp_path_factory):
    from transformers import AutoTokenizer

    trace = tmp_path_factory.mktemp("trace") / "registered.txt"
    tokenizer = AutoTokenizer.from_pretrained(demo["target"])
    answer = generate(str(demo["target"]), None, [CORPUS_PROMPT], 64).token_ids[0]
    corpus = trace.parent / "answers.jsonl"
    corpus.write_text(json.dumps({"prompt_ids": tokenizer(CORPUS_PROMPT).input_ids, "response_ids": answer}) + "\n")
    # fixed K: these tests need speculative steps to happen (adaptive depth is served in test_load.py); prompt and
    # corpus lookup on: requests' first drafts may come from their own text or the corpus (the head alone:
    # test_load.py)
    spec = {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8, "adaptive": False,
            "prompt_lookup_max": 5, "lookup_corpus": str(corpus)}
    config = ServerConfig(demo["target"], trace.parent / "server.log", max_model_len=1024, speculative_config=spec,
                          env={"PEAGLE_VLLM_TRACE_FILE": str(trace)})
    with running_server(config) as srv:
        yield {"base": srv.base_url, "pid": srv.pid, "trace": trace, "log": srv.log,
               "corpus_answer": tokenizer.decode(answer)}


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_completion_is_greedy_identical_to_offline_no_speculation(client, demo) -> None:
    served = client.completions.create(model="demo", prompt=PROMPT, max_tokens=64, temperature=0)
    offline = generate(str(demo["target"]), None, [PROMPT], 64)
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(demo["target"]).decode(offline.token_ids[0])
    assert served.choices[0].text == text


def test_streaming_matches_non_streaming(client) -> None:
    full = client.completions.create(model="demo", prompt=PROMPT, max_tokens=48, temperature=0).choices[0].text
    chunks = [c.choices[0].text for c in client.completions.create(model="demo", prompt=PROMPT, max_tokens=48,
                                                                     temperature=0, stream=True)]
    assert len(chunks) > 2 and "".join(chunks) == full


def test_chat_completion_and_chat_streaming(client) -> None:
    messages = [{"role": "user", "content": "def add(a, b):"}]
    reply = client.chat.completions.create(model="demo", messages=messages, max_tokens=32, temperature=0)
    assert reply.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="demo", messages=messages, max_tokens=32, temperature=0, stream=True))
    assert streamed == reply.choices[0].message.content


def test_metrics_show_peagle_series_consistent_with_vllm_counters(client, server) -> None:
    client.completions.create(model="demo", prompt=PROMPT, max_tokens=32, temperature=0)
    m = scrape_metrics(server["base"])
    assert m["vllm:spec_decode_num_drafts_total"] > 0 and m["vllm:spec_decode_num_accepted_tokens_total"] > 0
    assert m["peagle:accepted_tokens_per_position_total"] == m["vllm:spec_decode_num_accepted_tokens_total"]
    assert m["peagle:draft_tokens_per_position_total"] == m["vllm:spec_decode_num_draft_tokens_total"]
    assert m["peagle:acceptance_length_count"] > 0 and "peagle:block_acceptance_rate_window" in m
    # engine-core figures, carried across the process boundary: fixed K=8, so no fallback
    assert m["peagle:chosen_k_total"] >= m["vllm:spec_decode_num_drafts_total"]
    assert m["peagle:fallback_request_steps_total"] == 0 and m["peagle:steps_without_draft_total"] == 0
    assert m["peagle:draft_forward_seconds_count"] >= m["peagle:acceptance_length_count"]
    assert 0 < m["peagle:draft_forward_seconds_sum"] < m["peagle:draft_forward_seconds_count"]  # < 1 s each
    # the demo target's code repeats itself: some verified drafts came from prompt lookup, none beyond those verified
    assert 0 < m["peagle:lookup_draft_tokens_total"] <= m["vllm:spec_decode_num_draft_tokens_total"]


def test_periodic_log_line_has_peagle_figures(client, server) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        client.completions.create(model="demo", prompt=PROMPT, max_tokens=16, temperature=0)
        log = server["log"].read_text()
        if "p_eagle metrics: block acceptance over the last 20 steps" in log and "ms x" in log:
            assert "KV fetch" not in log  # our figures ride in vLLM's KV-fetch dict and never reach its readers
            return
        time.sleep(2)
    raise AssertionError("no p_eagle line in the server's periodic stats log")


def test_plugin_registered_in_every_vllm_process(server, client) -> None:
    client.completions.create(model="demo", prompt="x", max_tokens=2)
    pids = {int(line.split()[0]) for line in server["trace"].read_text().splitlines()}
    assert server["pid"] in pids, "not registered in the API server process"
    assert len(pids) >= 3, f"registered in {len(pids)} processes; expected API server, engine core and worker"


def test_the_model_runs_on_every_cpu_of_a_small_machine(server) -> None:
    """vLLM's CPU backend logs the cores it binds the worker's threads to; on a small machine they are all of them."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > SMALL_MACHINE_CPUS:
        pytest.skip(f"{len(cpus)} CPUs: vLLM's own reservation stands")
    bound = re.search(r"core ids=\[([\d, ]+)\]", server["log"].read_text())
    assert bound, "no thread binding in the server's log"
    assert [int(c) for c in bound.group(1).split(",")] == cpus


def test_bad_speculative_config_is_one_clear_line(demo) -> None:
    run = subprocess.run([sys.executable, "-m", "peagle_vllm.cli", "serve", str(demo["target"]), "--speculative-config",
                          json.dumps({"method": "p_eagle", "num_speculative_tokens": 4})],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("peagle-vllm: error: speculative_config['model'] is missing")


def test_served_benchmark_figures_come_from_real_streams(server) -> None:
    """The served half of `peagle-vllm bench`: 6 streams (ignore_eos), 3 at a time, each of its own length within
    16 x (1 +- 0.5), TTFT below the whole latency, and the acceptance length read from the server's own counters."""
    from peagle_vllm.harness.bench import output_lengths
    from peagle_vllm.harness.bench_served import measure

    fig = measure(server["base"], [PROMPT, "def f(x):\n"], 3, 16, 0.0, range_ratio=0.5)
    lengths = output_lengths(6, 16, 0.5)  # two requests per concurrent slot
    assert len(set(lengths)) > 1 and fig["tokens_per_s"] == pytest.approx(sum(lengths) / fig["seconds"])
    assert 0 < fig["ttft_ms"] < 1e3 * fig["seconds"]
    assert fig["tpot_ms"] > 0
    assert fig["acceptance_length"] > 1.0


def test_an_answer_in_the_lookup_corpus_is_drafted_from_it(client, server) -> None:
    """The corpus holds this prompt's greedy answer: served (the corpus indexed in the engine-core process), the
    answer is unchanged, drafts from lookup are among those verified, and most drafts are accepted (the head alone
    accepts ~1 of 8 on the demo target; offline, the corpus's effect alone: test_prompt_lookup.py)."""
    counters = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                "peagle:lookup_draft_tokens_total")
    before = scrape_metrics(server["base"])
    served = client.completions.create(model="demo", prompt=CORPUS_PROMPT, max_tokens=64, temperature=0)
    after = scrape_metrics(server["base"])
    drafted, accepted, looked_up = (after[c] - before[c] for c in counters)
    assert served.choices[0].text == server["corpus_answer"]
    print(f"drafts {drafted:.0f}, accepted {accepted:.0f}, from lookup {looked_up:.0f}")
    assert accepted > 0.6 * drafted and looked_up > 0


def test_a_sampled_stream_is_drafted_by_lookup_too(client, server) -> None:
    """A sampled streaming request on a prompt that repeats itself: it streams to the end, and some of its verified
    drafts came from prompt lookup (their distribution kept: test_sampling.py)."""
    before = scrape_metrics(server["base"])["peagle:lookup_draft_tokens_total"]
    stream = client.completions.create(model="demo", prompt="import os\nimport sys\n" * 3 + "import", max_tokens=48,
                                       temperature=0.8, top_p=0.9, seed=3, stream=True, extra_body={"ignore_eos": True})
    chunks = [c for c in stream]
    looked_up = scrape_metrics(server["base"])["peagle:lookup_draft_tokens_total"] - before
    assert chunks[-1].choices[0].finish_reason == "length"
    assert looked_up > 0
