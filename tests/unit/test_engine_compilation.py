"""`--compiled`: the harness's engines, offline and served, run the target eagerly unless asked to compile it."""

from __future__ import annotations

from pathlib import Path

import pytest

from peagle_vllm import cli
from peagle_vllm.harness import runs
from peagle_vllm.harness.server_process import ServerConfig, serve_command


@pytest.fixture
def eager_engines(monkeypatch):
    monkeypatch.setattr(runs, "_eager", True)


def test_a_served_target_is_compiled_only_when_asked(tmp_path: Path) -> None:
    config = ServerConfig(Path("models/target"), tmp_path / "server.log")
    assert "--enforce-eager" in serve_command(config, 8000)
    compiled = ServerConfig(Path("models/target"), tmp_path / "server.log", enforce_eager=False)
    assert "--enforce-eager" not in serve_command(compiled, 8000)


@pytest.mark.parametrize("command", [["bench"], ["demo"]])
def test_the_compiled_flag_reaches_the_engines(eager_engines, command: list[str]) -> None:
    cli.set_engine_flags(cli.build_parser().parse_args([*command, "--verbose"]))
    assert runs.engines_are_eager()
    cli.set_engine_flags(cli.build_parser().parse_args([*command, "--compiled", "--verbose"]))
    assert not runs.engines_are_eager()
