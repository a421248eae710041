"""Feature matrix, served rows (docs/feature-matrix.md): `peagle-vllm serve` SmolLM2-135M-Instruct with its
depth head (p_eagle, fixed K=8) beside a server without speculation, both with auto tool choice on; the
real openai client sends the same request to both. Structured outputs (response_format and vLLM's
`structured_outputs`), tool calling, streaming with usage, a cancelled stream, and min_p/logit_bias
(refused under speculation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peagle_vllm.harness.feature_matrix import KINDS, messages_for
from peagle_vllm.harness.server_process import ServerConfig, Server, running_servers, scrape_metrics, wait_until_idle

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "smollm2-peagle-depth"
SPEC = {"method": "p_eagle", "model": str(DRAFT), "num_speculative_tokens": 8, "adaptive": False}
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
MESSAGE = "Write a Python function that reverses a string."
REFUSED = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
# "strict": vLLM's hermes structural tag then pins the arguments to the schema (else only the call's envelope)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current local time in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def servers(smollm2, tmp_path_factory) -> tuple[Server, Server]:
    """(p_eagle, plain), started together."""
    target = smollm2
    logs = tmp_path_factory.mktemp("feature-matrix")
    with running_servers(ServerConfig(target, logs / "p_eagle.log", max_model_len=1024, speculative_config=SPEC,
                                      extra_args=TOOL_FLAGS),
                         ServerConfig(target, logs / "plain.log", max_model_len=1024, extra_args=TOOL_FLAGS)) as pair:
        yield pair[0], pair[1]


@pytest.fixture(scope="module")
def clients(servers):
    from openai import OpenAI

    return tuple(OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=600) for s in servers)


def drafts(server: Server) -> float:
    return scrape_metrics(server.base_url).get("vllm:spec_decode_num_drafts_total", 0.0)


def chat(client, content: str, **kwargs):
    return client.chat.completions.create(model="demo", messages=[{"role": "user", "content": content}],
                                          temperature=0, **kwargs)


def tool_calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("kind", list(KINDS))
def test_structured_output_served_identical(clients, kind: str) -> None:
    """response_format (json_schema, json_object) and extra_body structured_outputs (regex, choice, grammar)."""
    ours, plain = clients
    [content] = messages_for(kind, [MESSAGE])
    a = chat(plain, content, max_tokens=40, **KINDS[kind].openai).choices[0]
    b = chat(ours, content, max_tokens=40, **KINDS[kind].openai).choices[0]
    assert b.message.content == a.message.content and b.finish_reason == a.finish_reason
    if b.finish_reason == "stop":
        assert KINDS[kind].valid(b.message.content), b.message.content


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required", "auto"],
                         ids=["named", "required", "auto"])
def test_tool_call_served_identical(clients, servers, tool_choice) -> None:
    """Named and "required" tool choice force the call's JSON (vLLM's structured outputs); "auto" needs
    --enable-auto-tool-choice --tool-call-parser (hermes here) and leaves the choice to the model."""
    ours, plain = clients
    kwargs = {"tools": [WEATHER, TIME], "tool_choice": tool_choice, "max_tokens": 64}
    a = chat(plain, "What is the weather in Paris, in celsius?", **kwargs).choices[0]
    before = drafts(servers[0])
    b = chat(ours, "What is the weather in Paris, in celsius?", **kwargs).choices[0]
    assert tool_calls(b.message) == tool_calls(a.message)
    assert b.message.content == a.message.content and b.finish_reason == a.finish_reason
    if tool_choice != "auto":
        [(name, args)] = tool_calls(b.message)[:1]
        assert name == "get_weather" and isinstance(args.get("city"), str)
        assert args.get("unit") in ("celsius", "fahrenheit")
    else:
        assert drafts(servers[0]) > before  # unconstrained: every step drafted


def test_streaming_with_usage_equals_non_streamed(clients, servers) -> None:
    ours, plain = clients
    full = chat(ours, MESSAGE, max_tokens=48)
    before = drafts(servers[0])
    chunks = list(chat(ours, MESSAGE, max_tokens=48, stream=True, stream_options={"include_usage": True}))
    assert drafts(servers[0]) > before
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and text == full.choices[0].message.content
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])
    assert text == chat(plain, MESSAGE, max_tokens=48).choices[0].message.content


def test_cancelled_stream_then_next_request_correct(clients, servers) -> None:
    """A stream closed after 2 chunks is aborted (no request left running, its KV blocks back) and the
    next request is answered as by the plain server."""
    ours, plain = clients
    before = scrape_metrics(servers[0].base_url)
    stream = chat(ours, MESSAGE, max_tokens=600, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 1:
            break
    stream.close()
    idle = wait_until_idle(servers[0].base_url, timeout_s=120)
    generated = idle["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 1 <= generated < 300, f"{generated:.0f} tokens generated: the request was not aborted when its stream closed"
    assert idle["vllm:kv_cache_usage_perc"] == pytest.approx(before["vllm:kv_cache_usage_perc"], abs=1e-9)
    content = "Explain what a generator is in Python and when to use one."
    b = chat(ours, content, max_tokens=32).choices[0].message.content
    assert b == chat(plain, content, max_tokens=32).choices[0].message.content


@pytest.mark.parametrize("option", [{"min_p": 0.1}, {"logit_bias": {"42": 5.0}}], ids=lambda o: next(iter(o)))
def test_min_p_and_logit_bias_are_refused_served(clients, option: dict) -> None:
    """vLLM answers 400 with its one-line reason under speculation; the plain server serves the request."""
    import openai

    ours, plain = clients
    kwargs = {"max_tokens": 4, "temperature": 0.7}
    kwargs.update(option if "logit_bias" in option else {"extra_body": option})
    assert plain.chat.completions.create(model="demo", messages=[{"role": "user", "content": MESSAGE}],
                                         **kwargs).choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        ours.chat.completions.create(model="demo", messages=[{"role": "user", "content": MESSAGE}], **kwargs)
    assert REFUSED in str(err.value)
