"""`peagle-vllm bench`: side-by-side offline throughput on the same target and prompts —
no speculation, vLLM eagle3 (sequential), vLLM's built-in parallel drafting, and p_eagle with the
standard and the depth head — as ratios measured in one run. Writes a markdown table, JSON with
every raw figure, and PNG plots (speedup vs K per concurrency; per-position acceptance).
Concurrency c means c requests in flight, a new one entering as soon as one ends: served, c
streaming clients; offline, an engine with `max_num_seqs` c given all of the cell's requests at once
(as an offline user runs vLLM), so each concurrency gets engines of its own. Every request emits
`max_tokens` tokens (EOS ignored), or with a range ratio r its own length drawn once, uniformly within
max_tokens x (1 +- r), the same in every mode and round (as `vllm bench serve --random-range-ratio`):
requests of one length arriving together stay in step under plain decoding, and end ragged only where
speculation set them apart, which traffic of mixed lengths does anyway. Prefix caching is off
in every mode: the same prompts come back in every cell and round, and with caching on their
prefills would be skipped by modes without a drafter but partly recomputed by EAGLE-style ones
(vLLM drops their last cached block: 128 tokens on CPU), a difference of the benchmark's repetition,
not of decoding.
With several rounds, every mode runs every cell once per round, so that the machine's slow spells hit
every mode alike: offline, all engines of a concurrency are built at once and take turns cell by
cell (the order rotated each round), or with `fresh_engines` every engine is built anew in each round, one
at a time (the order reversed every other round), because an engine's speed can stay a few percent off an
identical engine's for its whole life, which rounds over the same engines never average out (measured in
docs/smollm2-results.md); served, each round starts every mode's server again (the order reversed every
other round). A cell's figure is then the median of its rounds, with their spread."""

from __future__ import annotations

import functools
import json
import math
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from peagle_vllm.harness.prompts import eval_prompts
from peagle_vllm.harness.real_target import CORPORA
from peagle_vllm.harness.runs import close_llm, engines_are_eager, make_llm, request_spec_figures, set_cpu_defaults

T = TypeVar("T")  # a prompt, or a replay's recorded prompt


# the shipped heads of each shipped target (models/<name>), by variant
HEADS = {"SmolLM2-135M-Instruct": {"eagle3": "smollm2-eagle3", "standard": "smollm2-peagle-standard",
                                   "depth": "smollm2-peagle-depth"},
         "demo-target": {"eagle3": "demo-eagle3", "standard": "demo-peagle-standard", "depth": "demo-peagle-depth"}}


@dataclass(frozen=True)
class Mode:
    name: str
    head: str | None  # the head's variant (see HEADS); None = no speculation
    extra: tuple = ()  # speculative-config entries besides model and K
    by_default: bool = True  # run when no --modes are named
    corpus: bool = False  # with the target's lookup corpus (CORPORA)
    head_depth: int | None = None  # the head drafts at most this deep (at most K), lookups past it

    def spec(self, target: Path, k: int) -> dict | None:
        if self.head is None:
            return None
        heads = HEADS.get(target.name)
        if heads is None:
            raise ValueError(f"no shipped heads for target {target.name}: use one of {', '.join(HEADS)}")
        model = target.parent / heads[self.head]
        corpus = {}
        if self.corpus:
            if target.name not in CORPORA:
                raise ValueError(f"mode {self.name}: no lookup corpus for target {target.name}; it has one for "
                                 f"{', '.join(CORPORA)}")
            corpus = {"lookup_corpus": str(CORPORA[target.name])}
        depth = {} if self.head_depth is None else {"head_depth": min(self.head_depth, k)}
        return {**dict(self.extra), **corpus, **depth, "model": str(model), "num_speculative_tokens": k}


MODES = [
    Mode("no-spec", None),
    Mode("vllm-eagle3", "eagle3", (("method", "eagle3"),)),
    Mode("vllm-parallel", "standard", (("method", "eagle3"), ("parallel_drafting", True))),
    Mode("p_eagle-standard", "standard", (("method", "p_eagle"), ("adaptive", False))),
    Mode("p_eagle-depth", "depth", (("method", "p_eagle"), ("adaptive", False))),
    Mode("p_eagle-depth-adaptive", "depth", (("method", "p_eagle"),)),
    # with prompt lookup beside the head (`peagle_vllm/lookup.py`): named with --modes only
    Mode("p_eagle-depth-lookup", "depth", (("method", "p_eagle"), ("adaptive", False), ("prompt_lookup_max", 5)),
         by_default=False),
    Mode("p_eagle-depth-adaptive-lookup", "depth", (("method", "p_eagle"), ("prompt_lookup_max", 5)), by_default=False),
    # ... and corpus lookup where the request's own text has no match (`peagle_vllm/corpus_lookup.py`)
    Mode("p_eagle-depth-lookup-corpus", "depth", (("method", "p_eagle"), ("adaptive", False), ("prompt_lookup_max", 5)),
         by_default=False, corpus=True),
    Mode("p_eagle-depth-adaptive-lookup-corpus", "depth", (("method", "p_eagle"), ("prompt_lookup_max", 5)),
         by_default=False, corpus=True),
    # ... with the head's drafts at the first two depths only, lookups' past them up to K
    Mode("p_eagle-depth-head2-lookup-corpus", "depth", (("method", "p_eagle"), ("adaptive", False),
                                                        ("prompt_lookup_max", 5)), by_default=False, corpus=True,
         head_depth=2),
]


MEDIAN_LEVEL = 0.9  # confidence of the intervals given with paired ratios
WARMUP = (4, 32)  # concurrency and tokens of the warm-up cell each engine or server runs before it is measured


def requests_for(prompts: list[T], concurrency: int) -> list[T]:
    """The requests of one cell: every prompt at least once (a single prompt at concurrency 1 would
    measure that prompt, not the traffic), and at least two per concurrent slot (the ragged end, where
    the last requests finish with the batch part empty, then weighs less)."""
    n = max(2 * concurrency, len(prompts))
    return (prompts * (n // len(prompts) + 1))[:n]


def output_lengths(count: int, max_tokens: int, range_ratio: float) -> list[int]:
    """Tokens each of `count` requests emits: `max_tokens`, or with a range ratio r each drawn uniformly within
    max_tokens x (1 +- r), at least 1, from a fixed seed (the same requests in every mode and round)."""
    low, high = max(round(max_tokens * (1 - range_ratio)), 1), round(max_tokens * (1 + range_ratio))
    draw = random.Random(0)
    return [draw.randint(low, high) for _ in range(count)]


def _measure(llm, prompts: list[str], concurrency: int, max_tokens: int, temperature: float,
             range_ratio: float = 0.0, top_p: float = 1.0) -> dict:
    """The cell's requests, all at once, to an engine that runs at most `concurrency` of them together
    (built with that `max_num_seqs`; see `_engine`), each emitting its `output_lengths` tokens."""
    from vllm import SamplingParams

    requests = requests_for(prompts, concurrency)
    # no seed: under adaptive depth a seeded sampled request keeps K_max (its seed then repeats its tokens),
    # which would measure a fixed K instead
    params = [SamplingParams(temperature=temperature, top_p=top_p if temperature > 0 else 1.0, max_tokens=n,
                             ignore_eos=True)
              for n in output_lengths(len(requests), max_tokens, range_ratio)]
    t0 = time.perf_counter()
    outs = llm.generate(requests, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    spec = request_spec_figures(outs)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "acceptance_length": spec.acceptance_length,
            "per_position": spec.per_position_rate}


def run_bench(target: Path, out_dir: Path, ks: list[int], concurrencies: list[int], temperatures: list[float],
              max_tokens: int, modes: list[str] | None = None, adaptive_ks: list[int] | None = None,
              interfaces: tuple[str, ...] = ("offline",), rounds: int = 1, range_ratio: float = 0.0,
              top_p: float = 1.0, prompt_count: int = 16, mode_ks: dict[str, list[int]] | None = None,
              fresh_engines: bool = False) -> list[dict]:
    """Every chosen mode at every K (adaptive modes at `adaptive_ks`, their K_max, when given; `mode_ks`:
    the Ks of the modes it names), concurrency and temperature (sampled cells with `top_p`), offline (`LLM`)
    and/or served (HTTP streaming), `rounds` times, requests emitting `output_lengths` tokens, on the
    target's held-out prompts with its shipped heads (`HEADS`); rows with raw figures (medians over the
    rounds) and ratios. `fresh_engines`: offline, an engine per mode, concurrency and round (see the module's doc)."""
    from tqdm import tqdm

    from peagle_vllm.harness.bench_served import run_mode

    set_cpu_defaults()
    prompts = eval_prompts(target, prompt_count, seed=1)
    chosen = [m for m in MODES if m.name in modes] if modes else [m for m in MODES if m.by_default]

    def ks_of(m: Mode) -> list[int]:
        if m.head is None:
            return [0]
        if mode_ks and m.name in mode_ks:
            return mode_ks[m.name]
        return adaptive_ks if adaptive_ks and "adaptive" in m.name else ks

    jobs = [(m, k) for m in chosen for k in ks_of(m)]
    rows: list[dict] = []
    bar = tqdm(total=len(jobs) * len(concurrencies) * len(temperatures) * len(interfaces) * rounds, desc="bench")

    def add(interface: str, rnd: int, mode: Mode, k: int, conc: int, temperature: float, figures: dict) -> None:
        rows.append({"interface": interface, "mode": mode.name, "k": k, "concurrency": conc,
                     "temperature": temperature, "round": rnd, **figures})
        bar.set_postfix_str(f"{interface} round {rnd + 1} {mode.name} K={k} c={conc} T={temperature}")
        bar.update()

    for interface in interfaces:
        if interface == "offline" and rounds > 1 and not fresh_engines:
            _offline_interleaved(target, jobs, prompts, concurrencies, temperatures, max_tokens, range_ratio,
                                 top_p, rounds, functools.partial(add, interface))
            continue
        for rnd in range(rounds):
            for mode, k in (jobs if rnd % 2 == 0 else jobs[::-1]):
                on_row = functools.partial(add, interface, rnd, mode, k)
                if interface == "served":
                    run_mode(target, mode.spec(target, k), prompts, concurrencies, temperatures, max_tokens,
                             range_ratio, on_row, top_p)
                    continue
                for conc in concurrencies:
                    llm = _warm_engine(target, mode.spec(target, k), conc, prompts)
                    for temperature in temperatures:
                        on_row(conc, temperature,
                               _measure(llm, prompts, conc, max_tokens, temperature, range_ratio, top_p))
                    close_llm(llm)
    bar.close()
    rows = median_of_rounds(rows)
    _add_ratios(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {_cpus()} CPUs",
            "target": target.name, "max_tokens": max_tokens, "range_ratio": range_ratio, "top_p": top_p,
            "prompts": len(prompts), "rounds": rounds, "fresh_engines": fresh_engines,
            "target_compiled": not engines_are_eager()}
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out_dir / "bench.md").write_text(markdown_table(rows) + "\n" + adaptive_summary(rows))
    write_plots(rows, out_dir)
    return rows


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _engine(target: Path, spec: dict | None, max_num_seqs: int):
    """An offline engine that runs at most `max_num_seqs` requests together, without prefix caching
    (see the module's doc), whose outputs carry their spec-decode histograms (see `runs.request_spec_figures`)."""
    extra = {} if spec is None else {"per_request_spec_decode_metrics": "summary"}
    return make_llm(str(target), spec, max_num_seqs=max_num_seqs, enable_prefix_caching=False, **extra)


def _warm_engine(target: Path, spec: dict | None, concurrency: int, prompts: list[str]):
    """`_engine` for one concurrency, after a short warm-up cell (an engine's first steps are slow)."""
    llm = _engine(target, spec, concurrency)
    _measure(llm, prompts[:2 * WARMUP[0]], *WARMUP, 0.0)
    return llm


def _offline_interleaved(target: Path, jobs: list[tuple[Mode, int]], prompts: list[str],
                         concurrencies: list[int], temperatures: list[float], max_tokens: int, range_ratio: float,
                         top_p: float, rounds: int, add) -> None:
    """Per concurrency, every job's engine at once (about 1 GiB each), each cell then measured round
    after round with every engine in turn (the order rotated each round), so that a slow spell of the
    machine falls on all modes of a cell alike rather than on whichever mode ran then."""
    for conc in concurrencies:
        engines = []
        try:
            for mode, k in jobs:
                engines.append(_warm_engine(target, mode.spec(target, k), conc, prompts))
            for temperature in temperatures:
                for rnd in range(rounds):
                    turn = rnd % len(jobs)
                    for (mode, k), llm in list(zip(jobs, engines))[turn:] + list(zip(jobs, engines))[:turn]:
                        add(rnd, mode, k, conc, temperature,
                            _measure(llm, prompts, conc, max_tokens, temperature, range_ratio, top_p))
        finally:
            for llm in engines:
                close_llm(llm)


def median_of_rounds(rows: list[dict]) -> list[dict]:
    """One row per mode, K and cell: the round with the median throughput (the lower middle one for an
    even count), with every round's throughput (in round order, so that modes can be compared round by
    round) and their spread ((max - min) / median)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mode"], r["k"], *_cell(r)), []).append(r)
    out = []
    for same in groups.values():
        mid = sorted(same, key=lambda r: r["tokens_per_s"])[(len(same) - 1) // 2]
        runs = [r["tokens_per_s"] for r in sorted(same, key=lambda r: r.get("round", 0))]
        out.append({**{k: v for k, v in mid.items() if k != "round"}, "rounds_tokens_per_s": [round(t, 1) for t in runs],
                    "spread": round((max(runs) - min(runs)) / statistics.median(runs), 3)})
    return out


def _cell(r: dict) -> tuple:
    """Rows compared with each other: same interface, concurrency and temperature."""
    return r["interface"], r["concurrency"], r["temperature"]


def _add_ratios(rows: list[dict]) -> None:
    """Each row's ratio to no speculation and to vLLM's built-in parallel drafting at ITS best K."""
    for r in rows:
        same = [x for x in rows if _cell(x) == _cell(r)]
        base = next((x["tokens_per_s"] for x in same if x["mode"] == "no-spec"), None)
        builtin = max((x["tokens_per_s"] for x in same if x["mode"] == "vllm-parallel"), default=None)
        r["vs_no_spec"] = round(r["tokens_per_s"] / base, 3) if base else None
        r["vs_vllm_parallel_best"] = round(r["tokens_per_s"] / builtin, 3) if builtin else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def markdown_table(rows: list[dict]) -> str:
    head = ("| interface | mode | K | conc. | T | tokens/s | TTFT ms | TPOT ms | acc. length | vs no-spec "
            "| vs vLLM parallel (best K) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['interface']} | {r['mode']} | {r['k'] or '-'} | {r['concurrency']} | {r['temperature']:g} | "
        f"{r['tokens_per_s']:.1f} | {_ms(r.get('ttft_ms'))} | {_ms(r.get('tpot_ms'))} | {r['acceptance_length']:.2f} | "
        f"{_ratio(r['vs_no_spec'])} | {_ratio(r['vs_vllm_parallel_best'])} |\n"
        for r in rows)


def _ratio(value: float | None) -> str:
    """A ratio cell: '-' where the mode it compares with was not run."""
    return "-" if value is None else f"{value:.2f}"


def adaptive_summary(rows: list[dict], fixed: str = "p_eagle-depth", adaptive: str = "p_eagle-depth-adaptive") -> str:
    """Per concurrency and temperature: adaptive depth against the best fixed K of the same head
    (found after the fact) and against no speculation. Empty when the run lacks either mode."""
    lines = []
    for cell in sorted({_cell(r) for r in rows}):
        same = [r for r in rows if _cell(r) == cell]
        best = max((r for r in same if r["mode"] == fixed), key=lambda r: r["tokens_per_s"], default=None)
        for r in (r for r in same if r["mode"] == adaptive and best is not None):
            base = next((x for x in same if x["mode"] == "no-spec"), None)
            lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]:g} | {r['k']} | {r['tokens_per_s']:.1f} | {best['k']} | "
                         f"{best['tokens_per_s']:.1f} | {r['tokens_per_s'] / best['tokens_per_s']:.2f} | "
                         f"{r['vs_no_spec'] or 0:.2f} | {_spread(r)} / {_spread(best)} / {_spread(base)} | "
                         f"{_paired(r, best)} | {_paired(r, base)} |")
    if not lines:
        return ""
    return ("| interface | conc. | T | adaptive K_max | adaptive tokens/s | best fixed K | its tokens/s "
            "| adaptive / best fixed | adaptive / no-spec | spread over rounds: adaptive / best fixed / no-spec "
            "| paired: adaptive / best fixed (90% interval) | paired: adaptive / no-spec (90% interval) |"
            "\n|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def paired_ratio(row: dict, other: dict | None) -> tuple[float, tuple[float, float] | None] | None:
    """The median over rounds of the row's throughput over the other's in the same round (a cell's modes
    run back to back in each round, so a slow spell of the machine weighs on both), with its interval
    (`median_interval`, None without rounds enough); None without several rounds of both."""
    mine, theirs = row.get("rounds_tokens_per_s", ()), (other or {}).get("rounds_tokens_per_s", ())
    if len(mine) < 2 or len(mine) != len(theirs):
        return None
    ratios = [a / b for a, b in zip(mine, theirs)]
    return statistics.median(ratios), median_interval(ratios)


def _paired(row: dict, other: dict | None) -> str:
    """`paired_ratio` as a table cell: "-" where there is none."""
    paired = paired_ratio(row, other)
    if paired is None:
        return "-"
    median, interval = paired
    return f"{median:.2f}" + ("" if interval is None else " ({:.2f}-{:.2f})".format(*interval))


def median_interval(values: list[float], level: float = MEDIAN_LEVEL) -> tuple[float, float] | None:
    """An interval holding the true median with probability `level` or more, whatever the distribution
    (rounds of this machine are far from normal): the j-th smallest and j-th largest value, for the
    largest j with 1 - 2 P(Binomial(n, 1/2) < j) >= level; None when even min-max falls short."""
    n = len(values)
    covered = [j for j in range(1, n // 2 + 1) if 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n >= level]
    if not covered:
        return None
    ordered = sorted(values)
    return ordered[covered[-1] - 1], ordered[n - covered[-1]]


def _spread(row: dict | None) -> str:
    """A row's spread over its rounds in percent; "-" for a single round (or no row)."""
    if row is None or len(row.get("rounds_tokens_per_s", ())) < 2:
        return "-"
    return f"{100 * row['spread']:.0f}%"


def write_plots(rows: list[dict], out_dir: Path) -> None:
    """speedup_vs_k.png (per concurrency: each mode's `vs_no_spec` against K) and per_position_acceptance.png (the
    largest K's acceptance by draft position, lowest concurrency), both greedy, or at the lowest temperature
    measured where no cell is greedy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperature = min(r["temperature"] for r in rows)
    cells = [r for r in rows if r["temperature"] == temperature]
    kind = "greedy" if temperature == 0 else f"T={temperature:g}"
    concs = sorted({r["concurrency"] for r in cells})
    fig, axes = plt.subplots(1, len(concs), figsize=(5 * len(concs), 4), squeeze=False)
    for ax, conc in zip(axes[0], concs):
        for interface, mode in sorted({(r["interface"], r["mode"]) for r in cells if r["k"]}):
            pts = sorted((r["k"], r["vs_no_spec"]) for r in cells if r["mode"] == mode and r["interface"] == interface
                         and r["concurrency"] == conc)
            if pts:
                ax.plot(*zip(*pts), marker="o", ls="--" if interface == "served" else "-",
                        label=mode if interface == "offline" else f"{mode} (served)")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2), ax.set_xlabel("K"), ax.set_ylabel("speedup vs no speculation")
        ax.set_title(f"concurrency {conc}, {kind}")
        _legend(ax)
    fig.tight_layout(), fig.savefig(out_dir / "speedup_vs_k.png", dpi=80), plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    deepest = max(r["k"] for r in cells)
    for r in cells:
        if r["k"] == deepest and r["concurrency"] == concs[0] and r["per_position"]:
            ax.plot(range(1, len(r["per_position"]) + 1), r["per_position"], marker=".", label=r["mode"])
    ax.set_xlabel("draft position"), ax.set_ylabel("acceptance rate"), ax.set_title(kind)
    _legend(ax)
    fig.tight_layout(), fig.savefig(out_dir / "per_position_acceptance.png", dpi=80), plt.close(fig)


def _legend(ax) -> None:
    """The axes' legend, where something was drawn with a label (an empty legend is a warning on the screen)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
