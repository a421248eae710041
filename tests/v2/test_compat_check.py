"""scripts/check_vllm_compat.py's V2 check, run against the installed vLLM 0.34 files (the wheel's content)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import io
import sys
import zipfile
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")
REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("check_vllm_compat", REPO / "scripts" / "check_vllm_compat.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _wheel(script, edit: dict[str, str | None] | None = None) -> zipfile.ZipFile:
    """A zip of the installed vllm's files that the table names (edited: path -> new text, None drops it)."""
    site = Path(vllm.__file__).resolve().parent.parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for module in sorted({need.module for need in script.V2_API}):
            text = (edit or {}).get(module, (site / module).read_text())
            if text is not None:
                zf.writestr(module, text)
    return zipfile.ZipFile(io.BytesIO(buffer.getvalue()))


def test_installed_vllm_has_the_whole_v2_api() -> None:
    script = _script()
    assert script.check_v2(_wheel(script)) == []


def test_a_renamed_hook_and_a_missing_module_are_reported() -> None:
    script = _script()
    site = Path(vllm.__file__).resolve().parent.parent
    speculator = (site / script.SPECULATOR).read_text().replace("def observe_verification(", "def observe_verdict(")
    problems = script.check_v2(_wheel(script, {script.SPECULATOR: speculator,
                                               "vllm/v1/worker/gpu/attn_utils.py": None}))
    assert f"{script.SPECULATOR}: DraftModelSpeculator.observe_verification: missing" in problems
    assert any(p.startswith("vllm/v1/worker/gpu/attn_utils.py: module missing") for p in problems)


def test_a_changed_signature_is_reported() -> None:
    script = _script()
    site = Path(vllm.__file__).resolve().parent.parent
    speculator = (site / script.SPECULATOR).read_text().replace(
        "def load_draft_model(\n        self, target_model: nn.Module, target_attn_layer_names: set[str]\n    )",
        "def load_draft_model(self, target_model: nn.Module)")
    assert speculator != (site / script.SPECULATOR).read_text()
    problems = script.check_v2(_wheel(script, {script.SPECULATOR: speculator}))
    assert any("load_draft_model: parameters (self, target_model) differ" in p for p in problems)


def test_table_matches_the_signatures_of_our_overrides() -> None:
    """Each hook we override is in the table with our own parameter list (so the check checks what we wrote)."""
    from peagle_vllm.vllm_adapter.v2.config import PEagleSpeculatorConfig
    from peagle_vllm.vllm_adapter.v2.speculator import PEagleSpeculator

    script = _script()
    table = {need.symbol.split(".", 1)[1]: need for need in script.V2_API
             if need.module in (script.SPECULATOR, script.SPEC_CONFIG) and need.exact and "." in need.symbol}
    checked = set()
    for cls in (PEagleSpeculator, PEagleSpeculatorConfig):
        for name, fn in vars(cls).items():
            fn = getattr(fn, "__func__", getattr(fn, "fget", fn))
            if name in table and callable(fn):
                tree = ast.parse(inspect.getsource(fn).strip().replace("\n    ", "\n"))
                ours = script._params(tree.body[0])
                assert ours[: len(table[name].params)] == table[name].params, (cls.__name__, name, ours)
                checked.add(name)
    assert {"propose", "observe_verification", "load_draft_model", "load_model", "set_attn", "capture",
            "init_cudagraph_manager", "configure", "num_lookahead_tokens", "max_num_draft_seqs"} <= checked


def test_v1_versions_point_to_the_patch_table(capsys) -> None:
    script = _script()
    assert script.main(["--vllm", "0.33.0"]) == 0
    assert capsys.readouterr().out.strip() == f"V1 check: see {script.V1_TABLE}"
    assert (REPO / script.V1_TABLE).is_file()
