"""The V1 patch table's rules on stand-in owners: each attribute patched once, a missing required target refused
with the vLLM version, optional ones skipped and reported; and the real table names each vLLM attribute once."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.worker.gpu_model_runner")  # the table imports the V1 hooks (vLLM 0.32/0.33)

from peagle_vllm.vllm_adapter.v1.patches import PATCHED_ATTR, PATCHES, Patch, PatchError, apply_patches  # noqa: E402


class Target:
    def step(self) -> str:
        return "vllm"


def _twice(original):
    def step(self) -> str:
        return "peagle+" + original(self)

    return step


def test_a_patch_wraps_the_original_and_records_it() -> None:
    class Owner(Target):
        pass

    globals()["Owner"] = Owner
    try:
        report = apply_patches((Patch(f"{__name__}:Owner", "step", _twice, "test"),), "0.32.0")
        assert report == {f"{__name__}:Owner.step": "patched"}
        assert Owner().step() == "peagle+vllm"
        assert vars(Owner)[PATCHED_ATTR]["step"] is Target.step
        with pytest.raises(PatchError, match=r"already patched.*0\.32\.0"):
            apply_patches((Patch(f"{__name__}:Owner", "step", _twice, "test"),), "0.32.0")
        assert Owner().step() == "peagle+vllm"  # the refused second patch changed nothing
        assert Target().step() == "vllm"  # the base class is untouched
    finally:
        del globals()["Owner"]


def test_missing_required_targets_are_refused_and_optional_ones_skipped() -> None:
    with pytest.raises(PatchError, match=r"vLLM 0\.99\.0 has no .*Target\.absent"):
        apply_patches((Patch(f"{__name__}:Target", "absent", _twice, "test"),), "0.99.0")
    with pytest.raises(PatchError, match="no_such_module"):
        apply_patches((Patch("no_such_module:Thing", "x", _twice, "test"),), "0.99.0")
    report = apply_patches((Patch(f"{__name__}:Target", "absent", _twice, "test", required=False),), "0.99.0")
    assert report == {f"{__name__}:Target.absent": "skipped: absent in this vLLM"}


def test_the_table_names_each_vllm_attribute_once_and_every_required_target_exists() -> None:
    from peagle_vllm.vllm_adapter.v1.patches import resolve

    names = [(p.owner, p.attribute) for p in PATCHES]
    assert len(names) == len(set(names))
    for patch in PATCHES:
        owner = resolve(patch.owner)
        assert owner is not None and hasattr(owner, patch.attribute) or not patch.required, patch
