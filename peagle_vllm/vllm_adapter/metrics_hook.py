"""`peagle:` Prometheus series (and a periodic log line) beside vLLM's own spec-decode counters, fed from the same per-step
SpecDecodingStats in the front end (hook on vllm/v1/spec_decode/metrics.py `SpecDecodingProm`), so the
two always agree. They appear on the server's /metrics and in `LLM.get_metrics()` (hook on
vllm/v1/engine/llm_engine.py `get_metrics_snapshot`, which keeps only `vllm:` names). The figures only
the engine core knows (chosen K, fallbacks, draft time) arrive inside SchedulerStats (see
scheduler_hook.make_stats) and are taken out in `StatLoggerManager.record`, before vLLM's loggers."""

from __future__ import annotations

import functools
import logging

import prometheus_client

from peagle_vllm.metrics import AcceptanceMonitor, EngineFigures
from peagle_vllm.vllm_adapter.config_hook import is_marked, mark_of
from peagle_vllm.vllm_adapter.scheduler_hook import CARRIER_FIELD

PREFIX = "peagle:"
logger = logging.getLogger("peagle_vllm")
_series: dict[str, object] = {}
_since_log = EngineFigures()  # engine figures received since the last periodic log line


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
            chosen_k=prometheus_client.Counter(
                "peagle:chosen_k", "Requests per engine step given each K (adaptive depth; 0: plain decoding).", ["k"]),
            fallbacks=prometheus_client.Counter(
                "peagle:fallback_request_steps", "Requests per engine step in fallback (K=0: plain decoding)."),
            steps_without_draft=prometheus_client.Counter(
                "peagle:steps_without_draft", "Engine steps with every request in fallback: the head did not run."),
            draft_seconds=prometheus_client.Histogram(
                "peagle:draft_forward_seconds", "Time of each draft: inputs, one head forward, sampling.",
                buckets=[1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0]),
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


def _observe_engine_figures(fig: EngineFigures) -> None:
    m = _metrics()
    for k, n in fig.chosen_k.items():
        m["chosen_k"].labels(str(k)).inc(n)
    m["fallbacks"].inc(fig.chosen_k.get(0, 0))
    m["steps_without_draft"].inc(fig.steps_without_draft)
    for _ in range(fig.draft_forwards):  # one forward per step: the mean of the step is each one's time
        m["draft_seconds"].observe(fig.draft_us / fig.draft_forwards / 1e6)
    _since_log.add(fig)


def _wrap_record(original):
    @functools.wraps(original)
    def record(self, scheduler_stats, *args, **kwargs):
        carrier = getattr(scheduler_stats, CARRIER_FIELD, None)
        fig = EngineFigures.take_from(carrier) if isinstance(carrier, dict) else None
        if fig is not None:
            _observe_engine_figures(fig)
        return original(self, scheduler_stats, *args, **kwargs)

    return record


def _engine_line() -> str:
    """Chosen K, fallbacks and draft time since the last line (then reset); empty when none came."""
    fig = _since_log
    chosen = sum(fig.chosen_k.values())
    if not chosen and not fig.draft_forwards:
        return ""
    mean_k = sum(k * n for k, n in fig.chosen_k.items()) / max(chosen, 1)
    line = (f", chosen K mean {mean_k:.2f} ({fig.chosen_k.get(0, 0) / max(chosen, 1):.0%} in fallback), "
            f"steps without a draft: {fig.steps_without_draft}, draft time "
            f"{fig.draft_us / 1e3 / max(fig.draft_forwards, 1):.2f} ms x {fig.draft_forwards}")
    fig.drain()
    return line


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
                "p_eagle metrics: block acceptance over the last 20 steps: %.1f%%, mean verified K per request: %.2f%s",
                100 * _series["window_rate"]._value.get(), drafted / drafts, _engine_line())

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
    """Wraps SpecDecodingProm.__init__/observe, SpecDecodingLogging.log, StatLoggerManager.record and
    LLMEngine's get_metrics_snapshot once."""
    from vllm.v1.engine import llm_engine
    from vllm.v1.metrics.loggers import StatLoggerManager
    from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingProm

    if getattr(SpecDecodingProm.observe, "__peagle_patched__", False):
        return
    SpecDecodingProm.__init__ = _wrap_init(SpecDecodingProm.__init__)
    SpecDecodingProm.observe = _wrap_observe(SpecDecodingProm.observe)
    SpecDecodingProm.observe.__peagle_patched__ = True
    SpecDecodingLogging.log = _wrap_log(SpecDecodingLogging.log)
    StatLoggerManager.record = _wrap_record(StatLoggerManager.record)
    llm_engine.get_metrics_snapshot = _with_peagle_series(llm_engine.get_metrics_snapshot)
