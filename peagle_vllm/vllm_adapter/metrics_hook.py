"""`peagle:` Prometheus series (and a periodic log line) beside vLLM's own spec-decode counters, fed from the same per-step
SpecDecodingStats in the front end (hook on vllm/v1/spec_decode/metrics.py `SpecDecodingProm`), so the
two always agree. They appear on the server's /metrics and in `LLM.get_metrics()` (hook on
vllm/v1/engine/llm_engine.py `get_metrics_snapshot`, which keeps only `vllm:` names)."""

from __future__ import annotations

import functools
import logging

import prometheus_client

from peagle_vllm.metrics import AcceptanceMonitor
from peagle_vllm.vllm_adapter.config_hook import is_marked, mark_of

PREFIX = "peagle:"
logger = logging.getLogger("peagle_vllm")
_series: dict[str, object] = {}


def _metrics() -> dict[str, object]:
    """The process's peagle: series, created once (prometheus refuses a second registration)."""
    if not _series:
        buckets = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 28, 33]
        _series.update(
            acceptance_length=prometheus_client.Histogram(
                "peagle:acceptance_length", "Tokens emitted per request per step (1 + accepted drafts), per step.",
                buckets=buckets),
            draft_tokens=prometheus_client.Histogram(
                "peagle:draft_tokens_per_request", "Drafts verified per request per step (the chosen K).",
                buckets=[0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
            accepted_per_pos=prometheus_client.Counter(
                "peagle:accepted_tokens_per_position", "Accepted drafts per position.", ["position"]),
            drafted_per_pos=prometheus_client.Counter(
                "peagle:draft_tokens_per_position", "Verified drafts per position.", ["position"]),
            window_rate=prometheus_client.Gauge(
                "peagle:block_acceptance_rate_window", "Accepted / drafted tokens over the last 20 steps."),
        )
    return _series


def _wrap_init(original):
    @functools.wraps(original)
    def __init__(self, speculative_config, *args, **kwargs):
        original(self, speculative_config, *args, **kwargs)
        self._peagle_monitor = None
        if speculative_config is not None and is_marked(speculative_config):
            opts = mark_of(speculative_config)["options"]
            self._peagle_monitor = AcceptanceMonitor(opts.get("acceptance_warn_below", 0.75))
            _metrics()

    return __init__


def _wrap_observe(original):
    @functools.wraps(original)
    def observe(self, stats, *args, **kwargs):
        original(self, stats, *args, **kwargs)
        monitor: AcceptanceMonitor | None = getattr(self, "_peagle_monitor", None)
        if monitor is None:
            return
        step = monitor.observe(stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
        if step is None:
            return
        m = _series
        m["acceptance_length"].observe(step.acceptance_length)
        m["draft_tokens"].observe(step.draft_tokens_per_request)
        m["window_rate"].set(step.window_rate)
        for pos, (acc, drafted) in enumerate(zip(stats.num_accepted_tokens_per_pos, stats.num_draft_tokens_per_pos)):
            if drafted:
                m["drafted_per_pos"].labels(str(pos)).inc(drafted)
                m["accepted_per_pos"].labels(str(pos)).inc(acc)
        if step.warning:
            logger.warning(step.warning)

    return observe


def _wrap_log(original):
    @functools.wraps(original)
    def log(self, log_fn=None, *args, **kwargs):
        """vLLM's periodic spec-decode line, then ours: the 20-step block acceptance and the verified K."""
        steps = self.num_drafts and list(self.num_drafts)
        drafts, drafted = sum(steps or []), sum(self.num_draft_tokens or [])
        if log_fn is None:
            original(self, *args, **kwargs)
        else:
            original(self, log_fn, *args, **kwargs)
        if _series and drafts:
            (log_fn or logger.info)(
                "p_eagle metrics: block acceptance over the last 20 steps: %.1f%%, mean verified K per request: %.2f",
                100 * _series["window_rate"]._value.get(), drafted / drafts)

    return log


def _with_peagle_series(original):
    @functools.wraps(original)
    def get_metrics_snapshot():
        from vllm.v1.metrics import reader

        collected = original()
        for metric in prometheus_client.REGISTRY.collect():
            if not metric.name.startswith(PREFIX):
                continue
            if metric.type == "histogram":
                for labels, buckets, count, total in reader._digest_histogram(
                        reader._get_samples(metric, "_bucket"), reader._get_samples(metric, "_count"),
                        reader._get_samples(metric, "_sum")):
                    collected.append(reader.Histogram(name=metric.name, labels=labels, buckets=buckets,
                                                      count=count, sum=total))
            else:
                suffix = "_total" if metric.type == "counter" else ""
                for s in reader._get_samples(metric, suffix):
                    kind = reader.Counter if metric.type == "counter" else reader.Gauge
                    collected.append(kind(name=metric.name, labels=s.labels,
                                          value=int(s.value) if kind is reader.Counter else s.value))
        return collected

    return get_metrics_snapshot


def patch() -> None:
    """Wraps SpecDecodingProm.__init__/observe, SpecDecodingLogging.log and LLMEngine's get_metrics_snapshot once."""
    from vllm.v1.engine import llm_engine
    from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingProm

    if getattr(SpecDecodingProm.observe, "__peagle_patched__", False):
        return
    SpecDecodingProm.__init__ = _wrap_init(SpecDecodingProm.__init__)
    SpecDecodingProm.observe = _wrap_observe(SpecDecodingProm.observe)
    SpecDecodingProm.observe.__peagle_patched__ = True
    SpecDecodingLogging.log = _wrap_log(SpecDecodingLogging.log)
    llm_engine.get_metrics_snapshot = _with_peagle_series(llm_engine.get_metrics_snapshot)
