"""Profiles are data: bundled files, a path to a new file, and flag overrides."""

from pathlib import Path

import pytest
import yaml

from simulator.errors import ProfileError
from simulator.profile import apply_overrides, bundled_profiles, load_profile

CHAT_8B = "llama-3.1-8b-instruct"
CHAT_70B = "llama-3.1-70b-instruct"
EMBEDDING = "bge-large-en-v1.5"


def test_bundles_gpu_asic_and_cim():
    assert {"gpu", "asic", "cim"} <= set(bundled_profiles())


@pytest.mark.parametrize(
    ("name", "models"),
    [
        ("gpu", {CHAT_8B, CHAT_70B, EMBEDDING}),
        ("asic", {CHAT_8B, EMBEDDING}),
        ("cim", {CHAT_8B}),
    ],
)
def test_each_profile_serves_the_models_of_its_hardware_class(name, models):
    assert {model.name for model in load_profile(name).models} == models


def test_gpu_has_the_most_slots_and_context_and_cim_the_fewest():
    gpu, asic, cim = (load_profile(name) for name in ("gpu", "asic", "cim"))
    assert gpu.slots > asic.slots > cim.slots
    assert gpu.max_context > asic.max_context > cim.max_context
    assert gpu.power.max_w > asic.power.max_w > cim.power.max_w
    assert 0 < gpu.precision.logit_noise < asic.precision.logit_noise < cim.precision.logit_noise
    assert gpu.precision.harmful_rate == asic.precision.harmful_rate == 0
    assert cim.precision.harmful_rate > 0


def test_the_70b_model_costs_about_eight_times_the_8b():
    gpu = load_profile("gpu")
    assert gpu.model(CHAT_70B).cost_scale / gpu.model(CHAT_8B).cost_scale == pytest.approx(8.75)


def test_override_replaces_one_figure_and_keeps_the_rest():
    cim = load_profile("cim")
    changed = apply_overrides(cim, {"slots": 8, "timing.decode_fixed_ms": 2.5})
    assert changed.slots == 8
    assert changed.timing.decode_fixed_ms == 2.5
    assert changed.timing.prefill_fixed_ms == cim.timing.prefill_fixed_ms
    assert changed.power == cim.power


def test_model_override_borrows_a_model_from_another_profile():
    cim = apply_overrides(load_profile("cim"), {}, [CHAT_8B, EMBEDDING])
    assert cim.model(EMBEDDING).kind == "embedding"
    assert cim.model(EMBEDDING).dimensions == 1024


def test_model_override_with_an_unknown_name_lists_the_known_models():
    with pytest.raises(ProfileError, match=r"'gpt-9' is not known .*llama-3.1-8b-instruct"):
        apply_overrides(load_profile("gpu"), {}, ["gpt-9"])


def test_power_figures_that_do_not_rise_are_rejected_with_the_values():
    with pytest.raises(ProfileError, match=r"idle_w \(300.0\) < batch1_w \(270.0\)"):
        apply_overrides(load_profile("gpu"), {"power.idle_w": 300.0})


def test_unknown_profile_name_lists_the_bundled_ones():
    with pytest.raises(ProfileError, match=r"bundled: asic, cim, gpu"):
        load_profile("tpu")


def test_a_fourth_kind_of_chip_is_a_new_file(tmp_path: Path):
    data = yaml.safe_load((Path(__file__).parents[2] / "simulator/profiles/asic.yaml").read_text())
    data.update(name="npu", slots=6, hardware="Example NPU")
    path = tmp_path / "npu.yaml"
    path.write_text(yaml.safe_dump(data))
    npu = load_profile(str(path))
    assert (npu.name, npu.slots, npu.hardware) == ("npu", 6, "Example NPU")


def test_a_profile_with_an_unknown_key_names_it(tmp_path: Path):
    path = tmp_path / "typo.yaml"
    data = yaml.safe_load((Path(__file__).parents[2] / "simulator/profiles/cim.yaml").read_text())
    data["timing"]["decode_fixd_ms"] = 1.0
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"timing.decode_fixd_ms"):
        load_profile(path)
