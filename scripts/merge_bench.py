"""One table and one speedup-against-K plot from several `peagle-vllm bench` runs of one concurrency.

Engines for every K at once do not fit in memory, so a sweep over K runs as several benchmarks, each with its
own no-speculation engine. Every row here is compared only with its own run's no speculation, round by round
(the paired median, with its 90% interval), never with another run's. Writes by_k.md, by_k.json and
speedup_vs_k.png to --out.

    python scripts/merge_bench.py --runs results/bench-smollm2-s48 results/bench-smollm2-k48-s48 \\
        results/bench-smollm2-k16-s48 --concurrency 1 --out results/bench-smollm2-c1-by-k-s48
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from peagle_vllm.harness.bench import paired_ratio, write_plots


def merged_rows(runs: list[Path], concurrency: int) -> list[dict]:
    """The runs' rows at `concurrency`, each with `run` (its directory's name) and `paired_vs_no_spec`;
    a mode at a K and temperature measured by two runs is refused (which would the table show?)."""
    rows, seen = [], {}
    for run in runs:
        own = [r for r in json.loads((run / "bench.json").read_text())["rows"] if r["concurrency"] == concurrency]
        for r in own:
            if r["mode"] == "no-spec":
                continue
            key = (r["interface"], r["mode"], r["k"], r["temperature"])
            if key in seen:
                raise SystemExit(f"merge_bench: {r['mode']} K={r['k']} T={r['temperature']:g} is in both "
                                 f"{seen[key]} and {run.name}: pass runs whose Ks do not overlap")
            seen[key] = run.name
            base = next(x for x in own if x["mode"] == "no-spec" and x["temperature"] == r["temperature"]
                        and x["interface"] == r["interface"])
            paired = paired_ratio(r, base)
            if paired is None:
                raise SystemExit(f"merge_bench: {run.name} has no rounds to pair (run it with --rounds 2 or more)")
            median, interval = paired
            rows.append({**r, "run": run.name, "paired_vs_no_spec": median, "paired_interval": interval})
    return sorted(rows, key=lambda r: (r["interface"], r["temperature"], r["mode"], r["k"]))


def markdown(rows: list[dict]) -> str:
    lines = ["| interface | T | mode | K | tokens/s | acc. length | vs no-spec, paired (90% interval) | run |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        interval = "" if not r["paired_interval"] else " ({:.2f}-{:.2f})".format(*r["paired_interval"])
        lines.append(f"| {r['interface']} | {r['temperature']:g} | {r['mode']} | {r['k']} | {r['tokens_per_s']:.1f} | "
                     f"{r['acceptance_length']:.2f} | {r['paired_vs_no_spec']:.2f}{interval} | {r['run']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="bench output directories")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = merged_rows(args.runs, args.concurrency)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "by_k.json").write_text(json.dumps({"runs": [str(r) for r in args.runs], "rows": rows}, indent=1))
    (args.out / "by_k.md").write_text(markdown(rows))
    # the plot's curves: each row's paired speedup against its own run's no speculation
    write_plots([{**r, "vs_no_spec": r["paired_vs_no_spec"]} for r in rows], args.out)
    print(markdown(rows) + f"written: {args.out}/by_k.md, by_k.json, speedup_vs_k.png, per_position_acceptance.png")


if __name__ == "__main__":
    main()
