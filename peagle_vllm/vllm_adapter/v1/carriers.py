"""Everything p_eagle sends between vLLM's processes, in one place.

- front end -> engine core and workers: the mark on the draft model's hf_config (`MARK_ATTR`, a plain dict
  so that it pickles and serialises with the config), read back as one typed `PEagleMark` per process;
- scheduler -> worker, on each SchedulerOutput: the step's draft depth (the most drafts any scheduled
  request may get; 0: no draft runs), the block counts of requests whose surplus blocks were released, and the
  positions of the drafts a lookup gave (their q is one-hot: `scheduled_q`);
- worker -> scheduler, on each ModelRunnerOutput: (draft runs, seconds) timed since the last step;
- engine core -> front end, inside SchedulerStats: the engine figures (`metrics.EngineFigures`), under
  `peagle:` keys in its one dict[str, int] field, taken out again before vLLM's loggers read it.
Attributes set on vLLM's step objects survive the pickling between processes; absent ones read as None.
"""

from __future__ import annotations

from dataclasses import dataclass

from peagle_vllm.config import PEagleOptions
from peagle_vllm.head import HeadConfig

MARK_ATTR = "peagle"
DRAFT_DEPTH_ATTR = "peagle_draft_depth"
BLOCK_COUNTS_ATTR = "peagle_block_counts"
LOOKUP_POSITIONS_ATTR = "peagle_lookup_positions"
DRAFT_TIME_ATTR = "peagle_draft_time"
STATS_CARRIER_FIELD = "num_kv_fetch_reqs_by_stage"  # SchedulerStats' one dict[str, int] field


@dataclass(frozen=True)
class PEagleMark:
    """What the config hook decided for a p_eagle engine: our options and the head's config."""

    options: PEagleOptions
    head: HeadConfig

    def to_dict(self) -> dict:
        return {"options": self.options.to_dict(), "head": self.head.to_dict()}


_TYPED: dict[int, tuple[dict, PEagleMark]] = {}  # id(raw mark) -> (raw mark, its typed view), per process


def set_mark(hf_config, mark: PEagleMark) -> None:
    setattr(hf_config, MARK_ATTR, mark.to_dict())


def is_marked(speculative_config) -> bool:
    """True when this SpeculativeConfig was made from a p_eagle request."""
    draft = getattr(speculative_config, "draft_model_config", None)
    return draft is not None and isinstance(getattr(draft.hf_config, MARK_ATTR, None), dict)


def mark_of(speculative_config) -> PEagleMark:
    """The typed mark of a marked SpeculativeConfig, built once per process."""
    raw = getattr(speculative_config.draft_model_config.hf_config, MARK_ATTR)
    hit = _TYPED.get(id(raw))
    if hit is None or hit[0] is not raw:
        hit = _TYPED[id(raw)] = (raw, PEagleMark(PEagleOptions(**raw["options"]), HeadConfig(**raw["head"])))
    return hit[1]


def draft_depth(scheduler_output) -> int | None:
    """The step's draft depth; None when the scheduler is not adaptive (K fixed)."""
    return getattr(scheduler_output, DRAFT_DEPTH_ATTR, None)


def set_draft_depth(scheduler_output, depth: int) -> None:
    setattr(scheduler_output, DRAFT_DEPTH_ATTR, depth)


def block_counts(scheduler_output) -> dict[str, tuple[int, ...]]:
    """{request id: blocks kept per KV group} of the requests whose surplus blocks were released."""
    return getattr(scheduler_output, BLOCK_COUNTS_ATTR, None) or {}


def set_block_counts(scheduler_output, counts: dict[str, tuple[int, ...]]) -> None:
    setattr(scheduler_output, BLOCK_COUNTS_ATTR, counts)


def lookup_positions(scheduler_output) -> dict[str, tuple[int, ...]]:
    """{request id: positions of its scheduled drafts that a lookup gave} (requests with none are absent)."""
    return getattr(scheduler_output, LOOKUP_POSITIONS_ATTR, None) or {}


def set_lookup_positions(scheduler_output, positions: dict[str, tuple[int, ...]]) -> None:
    setattr(scheduler_output, LOOKUP_POSITIONS_ATTR, positions)


def draft_time(runner_output) -> tuple[int, float]:
    """(draft runs, seconds) the worker timed since the previous step; (0, 0.0) when none came."""
    return getattr(runner_output, DRAFT_TIME_ATTR, None) or (0, 0.0)


def set_draft_time(runner_output, runs: int, seconds: float) -> None:
    setattr(runner_output, DRAFT_TIME_ATTR, (runs, seconds))


def stats_carrier(scheduler_stats) -> dict | None:
    """The dict inside vLLM's SchedulerStats that carries the engine figures (None if this vLLM lacks it)."""
    carrier = getattr(scheduler_stats, STATS_CARRIER_FIELD, None)
    return carrier if isinstance(carrier, dict) else None
