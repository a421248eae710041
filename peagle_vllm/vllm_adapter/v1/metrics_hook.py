"""`peagle:` Prometheus series (and a periodic log line) beside vLLM's own spec-decode counters, fed from the same per-step
SpecDecodingStats in the front end (hook on vllm/v1/spec_decode/metrics.py `SpecDecodingProm`), so the
two always agree. They appear on the server's /metrics and in `LLM.get_metrics()` (hook on
vllm/v1/engine/llm_engine.py `get_metrics_snapshot`, which keeps only `vllm:` names). The figures only
the engine core knows (chosen K, fallbacks, draft time) arrive inside SchedulerStats (see
scheduler_hook.make_stats) and are taken out in `StatLoggerManager.record`, before vLLM's loggers.
Each front end's state hangs on its own vLLM loggers: the series carry vLLM's labels (model_name, engine),
plus `acceptance` ("lossless", or "lossy" under verifier_accept_k/accept_tolerance), and are registered afresh
with each front end's Prometheus logger, as vLLM's own are (a process that
builds a second `LLM` reports that engine's figures, not a sum with the first's), and each engine's log
line reads its own acceptance window and figures."""

from __future__ import annotations

import functools

import prometheus_client

from peagle_vllm.metrics import AcceptanceMonitor, EngineFigures
from peagle_vllm.vllm_adapter.log import logger
from peagle_vllm.vllm_adapter.v1.carriers import is_marked, mark_of, stats_carrier

PREFIX = "peagle:"
STATE_ATTR = "_peagle"  # on vLLM's SpecDecodingProm / SpecDecodingLogging of a p_eagle engine: our state
ACCEPTANCE_LABEL = "acceptance"  # "lossy" when greedy requests may emit drafts that are not the target's argmax


def _unregister_ours() -> None:
    """Drops every peagle: collector from the registry, as vLLM drops its vllm: ones when a new
    front end's Prometheus logger starts: the series then belong to that front end's engines."""
    registry = prometheus_client.REGISTRY
    for collector in list(registry._collector_to_names):
        if getattr(collector, "_name", "").startswith(PREFIX):
            registry.unregister(collector)


def _new_series(labelnames: list[str]) -> dict[str, prometheus_client.metrics.MetricWrapperBase]:
    """Our series, labelled like vLLM's own (model_name, engine) and by acceptance, registered afresh."""
    _unregister_ours()
    buckets = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 28, 33]
    c, h = prometheus_client.Counter, prometheus_client.Histogram
    return dict(
        acceptance_length=h("peagle:acceptance_length",
                            "Tokens emitted per request per step (1 + accepted drafts), per step.", labelnames,
                            buckets=buckets),
        draft_tokens=h("peagle:draft_tokens_per_request", "Drafts verified per request per step (the chosen K).",
                       labelnames, buckets=[0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
        accepted_per_pos=c("peagle:accepted_tokens_per_position", "Accepted drafts per position.",
                           labelnames + ["position"]),
        drafted_per_pos=c("peagle:draft_tokens_per_position", "Verified drafts per position.",
                          labelnames + ["position"]),
        window_rate=prometheus_client.Gauge(
            "peagle:block_acceptance_rate_window", "Accepted / drafted tokens over the last 20 steps.", labelnames,
            multiprocess_mode="mostrecent"),
        chosen_k=c("peagle:chosen_k", "Requests per engine step given each K (adaptive depth; 0: plain decoding).",
                   labelnames + ["k"]),
        fallbacks=c("peagle:fallback_request_steps", "Requests per engine step in fallback (K=0: plain decoding).",
                    labelnames),
        steps_without_draft=c("peagle:steps_without_draft",
                              "Engine steps with every request in fallback: the head did not run.", labelnames),
        lookup_drafts=c("peagle:lookup_draft_tokens",
                        "Drafts verified that prompt or corpus lookup gave in place of the head's.", labelnames),
        draft_seconds=h("peagle:draft_forward_seconds", "Time of each draft: inputs, one head forward, sampling.",
                        labelnames,
                        buckets=[1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0]),
    )


class _PromState:
    """A p_eagle front end's Prometheus side: our series, and each engine's acceptance window."""

    def __init__(self, labelnames: list[str], per_engine_labelvalues: dict[int, list[object]],
                 warn_below: float) -> None:
        self.series = _new_series(labelnames)
        self.labels = per_engine_labelvalues
        self.monitors = {idx: AcceptanceMonitor(warn_below) for idx in per_engine_labelvalues}
        # each engine's children of the series labelled by engine only, and of chosen_k by K (added as
        # they come): looked up once rather than per step
        per_engine_only = [name for name in self.series if name not in ("accepted_per_pos", "drafted_per_pos", "chosen_k")]
        self.children = {idx: {name: self.series[name].labels(*labels) for name in per_engine_only}
                         for idx, labels in per_engine_labelvalues.items()}
        self.chosen_k: dict[int, dict[int, object]] = {idx: {} for idx in per_engine_labelvalues}

    def observe_spec(self, stats, engine_idx: int) -> None:
        monitor, labels = self.monitors.get(engine_idx), self.labels.get(engine_idx)
        step = monitor and monitor.observe(stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
        if step is None:
            return
        c, m = self.children[engine_idx], self.series
        c["acceptance_length"].observe(step.acceptance_length)
        c["draft_tokens"].observe(step.draft_tokens_per_request)
        c["window_rate"].set(step.window_rate)
        for pos, (acc, drafted) in enumerate(zip(stats.num_accepted_tokens_per_pos, stats.num_draft_tokens_per_pos)):
            if drafted:
                m["drafted_per_pos"].labels(*labels, str(pos)).inc(drafted)
                m["accepted_per_pos"].labels(*labels, str(pos)).inc(acc)
        if step.warning:
            logger.warning(step.warning)

    def observe_engine(self, fig: EngineFigures, engine_idx: int) -> None:
        labels = self.labels.get(engine_idx)
        if labels is None:
            return
        c, by_k = self.children[engine_idx], self.chosen_k[engine_idx]
        for k, n in fig.chosen_k.items():
            if k not in by_k:
                by_k[k] = self.series["chosen_k"].labels(*labels, str(k))
            by_k[k].inc(n)
        if 0 in fig.chosen_k:
            c["fallbacks"].inc(fig.chosen_k[0])
        if fig.steps_without_draft:
            c["steps_without_draft"].inc(fig.steps_without_draft)
        if fig.lookup_drafts:
            c["lookup_drafts"].inc(fig.lookup_drafts)
        for us in fig.draft_us:
            c["draft_seconds"].observe(us / 1e6)


class _LogState:
    """One engine's periodic-log side: its acceptance window and the engine figures since the last line."""

    def __init__(self) -> None:
        self.window = AcceptanceMonitor(0.0)  # warnings come from the Prometheus side
        self.rate: float | None = None
        self.since_log = EngineFigures()

    def engine_line(self) -> str:
        """Chosen K, fallbacks and draft time since the last line (then reset); empty when none came."""
        fig = self.since_log
        chosen = sum(fig.chosen_k.values())
        if not chosen and not fig.draft_us:
            return ""
        mean_k = sum(k * n for k, n in fig.chosen_k.items()) / max(chosen, 1)
        line = (f", chosen K mean {mean_k:.2f} ({fig.chosen_k.get(0, 0) / max(chosen, 1):.0%} in fallback), "
                f"steps without a draft: {fig.steps_without_draft}, draft time "
                f"{sum(fig.draft_us) / 1e3 / max(len(fig.draft_us), 1):.2f} ms x {len(fig.draft_us)}")
        if fig.lookup_drafts:
            line += f", drafts from lookup: {fig.lookup_drafts}"
        fig.drain()
        return line


def wrap_prom_init(original):
    @functools.wraps(original)
    def __init__(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs):
        original(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs)
        if speculative_config is not None and is_marked(speculative_config):
            options = mark_of(speculative_config).options
            acceptance = "lossy" if options.lossy else "lossless"
            values = {idx: [*labels, acceptance] for idx, labels in dict(per_engine_labelvalues).items()}
            setattr(self, STATE_ATTR, _PromState([*labelnames, ACCEPTANCE_LABEL], values,
                                                 options.acceptance_warn_below))

    return __init__


def _engine_idx(args: tuple, kwargs: dict, position: int) -> int:
    """vLLM's `engine_idx` argument, given at `position` among the remaining positional arguments or by
    name (0 when absent or None, as vLLM defaults it)."""
    idx = args[position] if len(args) > position else kwargs.get("engine_idx")
    return 0 if idx is None else idx


def wrap_prom_observe(original):
    @functools.wraps(original)
    def observe(self, stats, *args, **kwargs):
        original(self, stats, *args, **kwargs)
        state: _PromState | None = getattr(self, STATE_ATTR, None)
        if state is not None:
            state.observe_spec(stats, _engine_idx(args, kwargs, 0))

    return observe


def wrap_logging_init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        spec = vllm_config.speculative_config
        if spec is not None and is_marked(spec):
            setattr(self.spec_decoding_logging, STATE_ATTR, _LogState())

    return __init__


def wrap_logging_observe(original):
    @functools.wraps(original)
    def observe(self, stats, *args, **kwargs):
        original(self, stats, *args, **kwargs)
        state: _LogState | None = getattr(self, STATE_ATTR, None)
        if state is not None:
            step = state.window.observe(stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens)
            if step is not None:
                state.rate = step.window_rate

    return observe


def wrap_log(original):
    @functools.wraps(original)
    def log(self, log_fn=None, *args, **kwargs):
        """vLLM's periodic spec-decode line, then ours: the 20-step block acceptance and the verified K."""
        steps = self.num_drafts and list(self.num_drafts)
        drafts, drafted = sum(steps or []), sum(self.num_draft_tokens or [])
        if log_fn is None:
            original(self, *args, **kwargs)
        else:
            original(self, log_fn, *args, **kwargs)
        state: _LogState | None = getattr(self, STATE_ATTR, None)
        if state is not None and drafts and state.rate is not None:
            (log_fn or logger.info)(
                "p_eagle metrics: block acceptance over the last 20 steps: %.1f%%, mean verified K per request: %.2f%s",
                100 * state.rate, drafted / drafts, state.engine_line())

    return log


def _routes(manager, engine_idx: int):
    """This engine's states among a StatLoggerManager's loggers: the Prometheus one's, and the logging
    one's (per engine)."""
    for stat_logger in manager.stat_loggers:
        state = getattr(getattr(stat_logger, "spec_decoding_prom", None), STATE_ATTR, None)
        if state is not None:
            yield state
        per_engine = getattr(stat_logger, "per_engine_stat_loggers", {}).get(engine_idx)
        state = getattr(getattr(per_engine, "spec_decoding_logging", None), STATE_ATTR, None)
        if state is not None:
            yield state


def wrap_record(original):
    @functools.wraps(original)
    def record(self, scheduler_stats, *args, **kwargs):
        carrier = stats_carrier(scheduler_stats)
        fig = EngineFigures.take_from(carrier) if carrier else None  # (empty most steps)
        if fig is not None:
            idx = _engine_idx(args, kwargs, 2)  # after iteration_stats and mm_cache_stats
            for state in _routes(self, idx):
                if isinstance(state, _PromState):
                    state.observe_engine(fig, idx)
                else:
                    state.since_log.add(fig)
        return original(self, scheduler_stats, *args, **kwargs)

    return record


def wrap_get_metrics_snapshot(original):
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
