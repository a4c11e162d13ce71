"""Bundled profiles: enough of them, valid, and their stored shapes match a fresh parse."""

import json

import pytest

from sizing.profiles import PROFILES_DIR, gpu_ids, gpu_profile, model_ids, model_profile
from sizing.config import ModelShape, resolve_shape


def test_counts():
    assert len(model_ids()) >= 20
    assert len(gpu_ids()) >= 12


@pytest.mark.parametrize("key", model_ids())
def test_stored_shape_matches_config(key):
    profile = model_profile(key)
    assert resolve_shape(profile.config) == ModelShape.from_dict(profile.shape)
    assert profile.source


def test_every_class_is_covered():
    from sizing.profiles import bundled_shape

    shapes = [bundled_shape(k) for k in model_ids()]
    classes = {s.attention_class for s in shapes}
    kinds = {k for s in shapes for k in s.layer_kinds}
    assert {"MHA", "GQA", "MQA", "MLA"} <= classes
    assert {"full", "sliding", "chunked", "recurrent", "none"} <= kinds
    assert any("text_config" in model_profile(k).config for k in model_ids())


def test_gpu_memory_as_devices_report_it():
    # torch.cuda.mem_get_info() totals measured on real GPUs (what engines size from), and
    # nvidia-smi's beside them: H100 80GB HBM3 85,017,493,504 B / 81559 MiB, H200 150,109,880,320 B / 143771 MiB
    assert gpu_profile("h100-sxm").memory_bytes == 85_017_493_504
    assert gpu_profile("h200").memory_bytes == 150_109_880_320
    assert gpu_profile("h100-sxm").nvml_memory_mib == 81559
    assert gpu_profile("h200").nvml_memory_mib == 143771


def test_invalid_profile_is_rejected(tmp_path, monkeypatch):
    import sizing.profiles as profiles

    (tmp_path / "gpus").mkdir()
    bad = json.loads((PROFILES_DIR / "gpus" / "h100-sxm.json").read_text())
    bad["memory_bytes"] = -1
    (tmp_path / "gpus" / "broken.json").write_text(json.dumps(bad))
    monkeypatch.setattr(profiles, "PROFILES_DIR", tmp_path)
    profiles.gpu_ids.cache_clear()
    profiles.gpu_profile.cache_clear()
    try:
        with pytest.raises(profiles.KvsizeError, match="broken.json is invalid"):
            profiles.gpu_profile("broken")
    finally:
        profiles.gpu_ids.cache_clear()
        profiles.gpu_profile.cache_clear()


def test_moe_layer_freq_as_a_per_layer_list():
    # MiMo-V2-Flash gives moe_layer_freq as one 0/1 flag per layer; here the flags of a Qwen3-30B-A3B
    # config (configs/Qwen3-30B-A3B.json shape) rewritten that way: MoE exactly where the flag is 1.
    raw = json.loads((PROFILES_DIR / "models" / "qwen3-30b-a3b.json").read_text())["config"]
    raw = dict(raw, model_type="unknown_moe_model", architectures=["UnknownMoeForCausalLM"])
    n = raw["num_hidden_layers"]
    flags = [0 if i % 4 == 0 else 1 for i in range(n)]
    shape = resolve_shape(dict(raw, moe_layer_freq=flags))
    moe = [i for i, p in enumerate(shape.layer_params) if p.experts]
    assert moe == [i for i, x in enumerate(flags) if x]
    with pytest.raises(Exception, match="moe_layer_freq"):
        resolve_shape(dict(raw, moe_layer_freq=flags[:-1]))


def test_release_files_are_named_by_the_range_they_cover():
    import json

    from sizing.engines.releases import ENGINES_DIR

    for path in ENGINES_DIR.glob("*-*.json"):  # the release files (published.json, started.json hold no range)
        d = json.loads(path.read_text())
        first, last = d["first_version"], d["last_version"]
        assert path.name == f"{d['engine']}-{first if first == last else f'{first}-{last}'}.json"
