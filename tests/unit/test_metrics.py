"""The acceptance monitor on synthetic step counts; engine figures through their carrier dict."""

from __future__ import annotations

from peagle_vllm.metrics import AcceptanceMonitor, EngineFigures


def test_step_figures_and_window_rate() -> None:
    mon = AcceptanceMonitor(warn_below=0.5, window=4)
    step = mon.observe(num_drafts=4, num_draft_tokens=32, num_accepted=12)
    assert step.acceptance_length == 4.0 and step.draft_tokens_per_request == 8.0
    assert step.window_rate == 12 / 32
    assert mon.observe(0, 0, 0) is None  # a step without drafts changes nothing


def test_the_window_rate_covers_the_last_window_steps_only() -> None:
    """The window's sums are kept as steps enter and leave it: the rate is always that of the last `window` steps."""
    mon = AcceptanceMonitor(warn_below=0.5, window=4)
    counts = [(3, 8), (0, 8), (8, 8), (1, 4), (2, 16), (5, 5), (0, 32), (7, 9), (4, 4)]
    for i, (accepted, drafted) in enumerate(counts):
        last = counts[max(i - 3, 0): i + 1]
        rate = mon.observe(1, drafted, accepted).window_rate
        assert rate == sum(a for a, _ in last) / sum(d for _, d in last)


def test_warns_once_when_the_window_stays_low_and_again_after_recovery() -> None:
    mon = AcceptanceMonitor(warn_below=0.5, window=4)
    warnings = [mon.observe(2, 16, 2).warning for _ in range(8)]
    assert sum(w is not None for w in warnings) == 1 and warnings[3] is not None  # once the window is full
    for _ in range(6):
        mon.observe(2, 16, 16)
    again = [mon.observe(2, 16, 0).warning for _ in range(6)]
    assert sum(w is not None for w in again) == 1


def test_engine_figures_ride_in_a_shared_dict_and_leave_it_as_found() -> None:
    fig = EngineFigures()
    fig.add_choices([0, 0, 3, 8, 3])
    fig.add_choices([0, 0, 0])  # a step in fallback
    fig.steps_without_draft += 2
    fig.lookup_drafts += 5
    fig.add_draft(3, 0.0042)  # three forwards in one step: each at their mean
    fig.add_draft(1, 0.0021)
    fig.add_draft(0, 0.0)
    carrier = {"waiting_to_start": 1}  # vLLM's own keys stay untouched
    carrier.update(fig.drain())
    assert fig.drain() == {}  # drained: the next step starts from zero
    back = EngineFigures.take_from(carrier)
    assert carrier == {"waiting_to_start": 1}
    assert back.chosen_k == {0: 5, 3: 2, 8: 1} and back.steps_without_draft == 2 and back.lookup_drafts == 5
    assert back.draft_us == [1400, 1400, 1400, 2100]  # every forward's own time, for the histogram
    assert EngineFigures.take_from(carrier) is None
    back.add(back)
    assert back.chosen_k == {0: 10, 3: 4, 8: 2} and len(back.draft_us) == 8 and back.steps_without_draft == 4
    assert back.lookup_drafts == 10
