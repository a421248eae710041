"""The benchmark's bookkeeping on hand-made rows: which requests a cell sends, ratios, the adaptive summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from peagle_vllm.harness.bench import (_add_ratios, adaptive_summary, median_interval, median_of_rounds, output_lengths,
                               requests_for)


def test_a_cell_sends_every_prompt_and_two_per_concurrent_slot() -> None:
    prompts = ["a", "b", "c"]
    assert requests_for(prompts, 1) == prompts  # concurrency 1 still measures every prompt, one after another
    assert requests_for(prompts, 4) == ["a", "b", "c", "a", "b", "c", "a", "b"]


def test_output_lengths_are_fixed_by_default_and_else_drawn_within_the_range_the_same_every_time() -> None:
    assert output_lengths(5, 64, 0.0) == [64] * 5
    drawn = output_lengths(400, 64, 0.5)
    assert min(drawn) == 32 and max(drawn) == 96  # both ends reached in 400 draws from 65 values
    assert 60 < sum(drawn) / len(drawn) < 68
    assert output_lengths(400, 64, 0.5) == drawn  # every mode and round sends the same requests
    assert output_lengths(10, 64, 0.5) == drawn[:10]  # a smaller cell sends the first of them
    assert min(output_lengths(50, 2, 0.9)) == 1  # never a request of no tokens


def test_the_cli_names_a_range_ratio_out_of_bounds_and_what_it_takes(capsys) -> None:
    from peagle_vllm.cli import build_parser

    assert build_parser().parse_args(["bench", "--range-ratio", "0.5"]).range_ratio == 0.5
    for bad in ("1", "-0.1", "half"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "--range-ratio", bad])
        error = capsys.readouterr().err.splitlines()[-1]
        assert "argument --range-ratio" in error and f"'{bad}' is not a fraction in [0, 1)" in error


def test_unknown_modes_are_named_and_lookup_modes_run_only_when_named() -> None:
    from peagle_vllm.cli import main
    from peagle_vllm.harness.bench import MODES

    for flag in (["--modes", "p_eagle-deep"], ["--mode-k", "p_eagle-deep=4"]):
        with pytest.raises(SystemExit, match=f"{flag[0]} names unknown modes p_eagle-deep: use one of no-spec"):
            main(["bench", "--target", "models/none", "--out", "unused", *flag])
    assert [m.name for m in MODES if not m.by_default] == ["p_eagle-depth-lookup", "p_eagle-depth-adaptive-lookup",
                                                           "p_eagle-depth-lookup-corpus",
                                                           "p_eagle-depth-adaptive-lookup-corpus",
                                                           "p_eagle-depth-head2-lookup-corpus"]


def test_corpus_modes_take_the_targets_corpus() -> None:
    from peagle_vllm.corpus_lookup import read_answers
    from peagle_vllm.harness.bench import MODES

    mode = next(m for m in MODES if m.name == "p_eagle-depth-lookup-corpus")
    spec = mode.spec(Path("models/SmolLM2-135M-Instruct"), 4)
    assert spec["prompt_lookup_max"] == 5 and spec["adaptive"] is False
    assert len(read_answers(Path(spec["lookup_corpus"]))) > 30_000  # the heads' distilled answers, in the repository
    with pytest.raises(ValueError, match="no lookup corpus for target demo-target"):
        mode.spec(Path("models/demo-target"), 4)
    head2 = next(m for m in MODES if m.name == "p_eagle-depth-head2-lookup-corpus")
    assert head2.spec(Path("models/SmolLM2-135M-Instruct"), 8)["head_depth"] == 2
    assert head2.spec(Path("models/SmolLM2-135M-Instruct"), 1)["head_depth"] == 1  # never past K
    assert "head_depth" not in spec


def _row(mode: str, k: int, tps: float, conc: int = 1) -> dict:
    return {"interface": "offline", "mode": mode, "k": k, "concurrency": conc, "temperature": 0.0,
            "tokens_per_s": tps, "acceptance_length": 1.0}


def test_ratios_use_no_spec_and_the_builtin_parallel_at_its_best_k() -> None:
    rows = [_row("no-spec", 0, 100.0), _row("vllm-parallel", 4, 80.0), _row("vllm-parallel", 8, 50.0),
            _row("p_eagle-depth", 8, 120.0), _row("p_eagle-depth", 8, 30.0, conc=16)]
    _add_ratios(rows)
    assert rows[3]["vs_no_spec"] == 1.2 and rows[3]["vs_vllm_parallel_best"] == 1.5
    assert rows[4]["vs_no_spec"] is None  # no baseline measured in its cell


def test_adaptive_summary_compares_with_the_best_fixed_k_found_after_the_fact() -> None:
    rows = [_row("no-spec", 0, 100.0), _row("p_eagle-depth", 1, 90.0), _row("p_eagle-depth", 4, 95.0),
            _row("p_eagle-depth-adaptive", 32, 99.0)]
    _add_ratios(rows)
    line = adaptive_summary(rows).splitlines()[-1]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[5] == "4" and float(cells[7]) == pytest.approx(99 / 95, abs=0.01) and cells[8] == "0.99"


def test_rounds_collapse_to_the_median_round_with_its_spread_and_pair_up_round_by_round() -> None:
    rows = [{**_row("no-spec", 0, t), "round": i} for i, t in enumerate((100.0, 80.0, 90.0))]
    rows += [{**_row("p_eagle-depth-adaptive", 32, t), "round": i} for i, t in enumerate((105.0, 72.0, 99.0))]
    rows += [_row("p_eagle-depth", 8, 120.0, conc=16)]
    base, adaptive, single = median_of_rounds(rows)
    assert base["tokens_per_s"] == 90.0 and base["rounds_tokens_per_s"] == [100.0, 80.0, 90.0] and "round" not in base
    assert base["spread"] == pytest.approx(20 / 90, abs=1e-3) and single["spread"] == 0.0
    cell = [base, _row("p_eagle-depth", 4, 95.0), adaptive]
    _add_ratios(cell)
    cells = [c.strip() for c in adaptive_summary(cell).splitlines()[-1].strip(" |").split("|")]
    assert cells[9] == "33% / - / 22%"
    # round by round the adaptive engine ran at 1.05, 0.90 and 1.10 of plain decoding: the median is 1.05,
    # where the medians of the two columns (99 / 90) say 1.10; against a single fixed-K round no pairing
    assert cells[11] == "1.05" and cells[10] == "-"


def test_the_median_interval_widens_to_the_order_statistics_its_confidence_needs() -> None:
    assert median_interval([1.0, 0.9, 1.1]) is None  # min-max holds the median with probability 3/4 only
    assert median_interval([5, 1, 7, 3, 2, 6, 4]) == (1, 7)  # n=7: min-max 98%, the 2nd values 88% only
    assert median_interval(list(range(11, 0, -1))) == (3, 9)  # n=11: the 3rd values 93%, the 4th 77%
    assert median_interval(list(range(11)), level=0.7) == (3, 7)


def test_acceptance_is_summed_from_each_outputs_own_histogram() -> None:
    from types import SimpleNamespace

    from peagle_vllm.harness.runs import request_spec_figures

    def out(histogram: list[int], drafted: int):
        metrics = SimpleNamespace(histogram=histogram, num_draft_tokens=drafted)
        return SimpleNamespace(outputs=[SimpleNamespace(spec_decode_metrics=metrics)])

    # request 1: steps accepting 0, 2, 2 drafts of 3; request 2: one step accepting 1 of 2; request 3: no speculation
    figures = request_spec_figures([out([1, 0, 2, 0], 9), out([0, 1, 0], 2), out([0], 0)])
    assert (figures.drafts, figures.draft_tokens, figures.accepted) == (4, 11, 5)
    assert figures.acceptance_length == 1 + 5 / 4 and figures.per_position == [3, 2, 0]


def test_a_run_without_greedy_cells_plots_its_sampled_ones_and_warns_of_nothing(tmp_path) -> None:
    import warnings

    import numpy as np
    from PIL import Image

    from peagle_vllm.harness.bench import write_plots

    rows = [dict(_row("no-spec", 0, 20.0), temperature=1.0, vs_no_spec=1.0, per_position=[]),
            dict(_row("p_eagle-depth", 2, 30.0), temperature=1.0, vs_no_spec=1.5, per_position=[0.4, 0.1])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns of a legend with nothing in it
        write_plots(rows, tmp_path)
    for name in ("speedup_vs_k.png", "per_position_acceptance.png"):
        rgb = np.asarray(Image.open(tmp_path / name).convert("RGB")).astype(int)
        assert (rgb.max(-1) - rgb.min(-1) > 100).any(), f"{name} has a coloured line (axes and grid are grey)"
