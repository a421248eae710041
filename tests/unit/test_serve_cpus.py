"""`peagle-vllm serve` on a small CPU machine: the model's threads get every CPU unless the user says otherwise."""

from __future__ import annotations

import os

import pytest

from peagle_vllm.vllm_adapter import serve


@pytest.mark.parametrize("cpus, expected", [({0}, "0"), ({0, 1}, "0"), (set(range(8)), None)])
def test_small_machines_reserve_no_cpu(monkeypatch, cpus: set[int], expected: str | None) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    environ: dict[str, str] = {}
    serve.give_the_model_every_cpu(environ)
    assert environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == expected


def test_the_users_reservation_stands(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    environ = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    serve.give_the_model_every_cpu(environ)
    assert environ == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}


def test_without_cpu_affinity_the_cpu_count_decides(monkeypatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    environ: dict[str, str] = {}
    serve.give_the_model_every_cpu(environ)
    assert environ == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
