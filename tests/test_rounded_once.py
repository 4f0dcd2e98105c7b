"""A layer rounded to nearest in the build is rounded once: the layer job leaves the float32 scales, and
the checks rebuild TopOp's weights from them and the device weight file, to the bit of rounding again."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from llmbuild.artifacts.layer_weights import checked_layer_weights, layer_weights, rounds_in_build
from llmbuild.artifacts.paths import BuildPaths, read_spec
from llmbuild.binary.memory_map import MemoryPlan
from llmbuild.recipe import load_recipe
from llmbuild.steps.dag import check_priority
from llmbuild.steps.layer import build_layer
from llmbuild.steps.plan import plan
from llmbuild.steps.prepare import prepare

ROOT = Path(__file__).resolve().parent.parent


def _recipes(tmp_path: Path) -> Path:
    """The shipped tiny recipes plus a w8 one (per-channel levels, unpacked bytes on the device)."""
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    text = (recipes / "qwen2_tiny_w4_rtn.yaml").read_text()
    (recipes / "qwen2_tiny_w8_rtn.yaml").write_text(text.replace("mode: w4bf16", "mode: w8bf16")
                                                      .replace("  group_size: 32\n", ""))
    return recipes


@pytest.mark.parametrize("name", ["qwen2_tiny_w4_rtn", "qwen2_tiny_w8_rtn", "llama_tiny_w8_rtn"])  # bf16, f16
def test_checks_read_back_the_layer_jobs_rounding(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBUILD_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("LLMBUILD_RECIPES", str(_recipes(tmp_path)))
    recipe = load_recipe(name)
    assert rounds_in_build(recipe)
    prepare(recipe)
    plan(recipe)
    build_layer(recipe, 1)
    paths = BuildPaths.of(recipe)
    spec = read_spec(paths.spec)
    plan_of = MemoryPlan.read(paths.plan)
    assert paths.layer_rounded_scales(1).is_file()
    again = layer_weights(recipe, paths, spec, 1)[0]
    read_back = checked_layer_weights(recipe, paths, spec, plan_of, 1)
    assert sorted(read_back) == sorted(again)
    assert sum(key.endswith(".qweight") for key in again) == 7  # every projection compared, none skipped
    for key, value in again.items():
        assert read_back[key].dtype == value.dtype and read_back[key].shape == value.shape, key
        np.testing.assert_array_equal(read_back[key], value, err_msg=key)
    # Without the scales file (a check run by hand on an older build) the check rounds again.
    paths.layer_rounded_scales(1).unlink()
    fallback = checked_layer_weights(recipe, paths, spec, plan_of, 1)
    assert all(np.array_equal(fallback[k], v) for k, v in again.items())


def test_only_a_rounding_build_writes_scales_and_device_shards_check_first() -> None:
    assert not rounds_in_build(load_recipe("qwen2_tiny_f32"))
    assert not rounds_in_build(load_recipe("qwen2_tiny_w4"))  # a GPTQ checkpoint's levels, imported
    assert rounds_in_build(load_recipe("smollm2_135m_w8"))
    # Layers 0, n/2 and n-1 (SmolLM2: 0, 15, 29) run on the simulated device: their shards are started first.
    assert [check_priority("smollm2_135m_bf16", shard) for shard in ([0, 1], [2, 3, 4], [14, 15], [29])] == [1, 0, 1, 1]
