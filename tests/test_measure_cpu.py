"""measure/ on the CPU: real tensors hold exactly the predicted bytes, quantizers stay within
bounds, and the committed GPU reports validate (and a tampered one does not)."""

import copy
import json

import pytest

torch = pytest.importorskip("torch")

from conftest import ROOT  # noqa: E402
from measure.quant import ERROR_BOUNDS, realistic_kv, relative_error, roundtrip  # noqa: E402
from measure.run import model_shape  # noqa: E402
from measure.tensors import allocate_layout, predicted_bytes  # noqa: E402
from measure.validate import check_report  # noqa: E402
from sizing.errors import KvsizeError  # noqa: E402
from sizing.cache.formats import FORMAT_NAMES, get_format  # noqa: E402
from sizing.cache.layers import build_layout  # noqa: E402

REPORTS = sorted((ROOT / "measure" / "reports").glob("*.json"))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("model", ["llama-3.1-8b:2", "deepseek-v2:2", "gpt-oss-20b:2"])
def test_real_tensors_hold_the_predicted_bytes(fmt, model):
    name, layers = model.split(":")
    _, shape = model_shape(name, int(layers))
    if get_format(fmt).mla_only and not shape.is_mla:
        with pytest.raises(KvsizeError, match="MLA latent"):
            build_layout(shape, fmt, fmt)
        return
    layout = build_layout(shape, fmt, fmt)
    cache = allocate_layout(layout, num_blocks=3, block_size=16, device="meta")
    assert cache.storage_bytes == predicted_bytes(layout, 3, 16)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_quantize_dequantize_within_bound(fmt):
    g = torch.Generator().manual_seed(1)
    k, v = realistic_kv(512, 2, 128, g)
    assert relative_error(roundtrip(fmt, k, "k"), k) <= ERROR_BOUNDS[fmt]
    assert relative_error(roundtrip(fmt, v, "v"), v) <= ERROR_BOUNDS[fmt]


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_committed_reports_validate(path):
    from measure.validate import report_problems

    assert report_problems(LOADED[path]) == []


LOADED = {p: json.loads(p.read_text()) for p in REPORTS}  # read once; a test that changes one deep-copies it
CAPACITY_REPORTS = [p for p in REPORTS if any(LOADED[p].get(k) for k in ("capacity", "tensor_parallel"))]
KERNEL_REPORTS = [p for p in REPORTS if LOADED[p].get("decode_efficiency")]


@pytest.mark.parametrize("path", KERNEL_REPORTS, ids=lambda p: p.name)
def test_a_kernel_report_with_its_times_raised_10_percent_is_rejected(path):
    report = LOADED[path]
    assert check_report(report) == []
    bad = copy.deepcopy(report)
    for point in bad["kernels"]:
        point["median_ms"] *= 1.1
    assert any("times and fit disagree" in p for p in check_report(bad))


@pytest.mark.parametrize("path", CAPACITY_REPORTS, ids=lambda p: p.name)
def test_a_report_with_its_measured_figures_raised_10_percent_is_rejected(path):
    # Memory figures are held to 1% or exactly; kernel times to 15% (measure/validate.py), so only
    # the capacity and allocation reports can be held to a 10% change.
    report = LOADED[path]
    bad = copy.deepcopy(report)
    raised = 0
    for section in ("allocation", "capacity", "tensor_parallel"):
        for point in bad.get(section, []):
            for key in ("storage_bytes",):
                if key in point:
                    point[key] = point[key] * 1.1
                    raised += 1
            for key in ("weights_bytes", "weights_tensor_bytes", "activation_bytes", "non_torch_bytes", "num_blocks"):
                if key in point.get("measured", {}):
                    point["measured"][key] = int(point["measured"][key] * 1.1)
                    raised += 1
    assert raised
    problems = check_report(bad)
    points = len(report.get("capacity", [])) + len(report.get("tensor_parallel", []))
    assert len(problems) >= points  # every capacity and tensor-parallel point is caught


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_allocation_returns_to_baseline_on_gpu():
    from measure.run import Gpu, measure_allocation

    point = measure_allocation(Gpu(), "llama-3.1-8b", "nvfp4", 64, 2, 16)
    assert point["storage_error_bytes"] == 0 and point["released_to_baseline"]


def test_validate_catches_kernel_time_that_the_model_does_not_predict():
    """kvsize validate recomputes each kernel point's time with sizing's attention_seconds; a
    report whose measured time is far from it fails (times are in seconds, so the relative
    error must not be floored at 1)."""
    import copy
    import json

    from conftest import ROOT
    from measure.validate import check_report

    report = json.loads((ROOT / "measure" / "reports" / "h200-decode-kernels.json").read_text())
    assert check_report(report) == []
    slow = copy.deepcopy(report)
    point = next(p for p in slow["kernels"] if p["format"] == "bf16" and p["batch"] == 16 and p["context"] == 32768)
    point["median_ms"] *= 2
    problems = check_report(slow)
    # the time is off the model, and the bandwidths stored beside it no longer follow from it
    assert all("bf16 b16 ctx32768" in line for line in problems)
    assert any("predicted" in line for line in problems) and any("does not follow" in line for line in problems)
    wrong_bytes = copy.deepcopy(report)
    next(p for p in wrong_bytes["kernels"] if p["format"] == "nvfp4")["bytes_read"] += 1
    assert any("sizing's layout holds" in line for line in check_report(wrong_bytes))


def _kernel_points(per_byte, overhead, per_sequence, per_token, batches=(1, 4, 16, 32),
                   contexts=(1024, 4096, 16384, 32768), bytes_per_token=65536):
    return [dict(format="bf16", batch=b, context=c, bytes_read=b * c * bytes_per_token,
                 median_ms=1e3 * (overhead + per_byte * b * c * bytes_per_token + per_sequence * b + per_token * c))
            for b in batches for c in contexts]


def test_time_fit_recovers_each_term():
    """Points made from known terms (12 us overhead, 0.3 us per sequence, 0.3 ns per context
    token, 90% of 4,800 GB/s: the sizes of the H200 bf16 fit) give those terms back."""
    from measure.kernel_bench import efficiency_section

    per_byte = 1 / (0.9 * 4800e9)
    points = _kernel_points(per_byte, 12e-6, 0.3e-6, 0.3e-9)
    section = efficiency_section(points, 4800.0, 1)
    assert section["kv"]["bf16"] == pytest.approx(0.9, rel=1e-6)
    assert section["overhead_s"]["bf16"] == pytest.approx(12e-6, rel=1e-6)
    assert section["per_sequence_s"]["bf16"] == pytest.approx(0.3e-6, rel=1e-6)
    assert section["per_context_token_s"]["bf16"] == pytest.approx(0.3e-9, rel=1e-6)
    assert max(abs(p["prediction_error_pct"]) for p in points) < 1e-6


def test_time_fit_keeps_every_term_a_cost():
    """A term that would come out negative is dropped and the rest refitted; a grid too small for
    four parameters gets overhead and bandwidth only."""
    from measure.kernel_bench import efficiency_section

    per_byte = 1 / (0.8 * 4800e9)
    points = _kernel_points(per_byte, 12e-6, -0.5e-6, 0.0)  # time falling with batch at equal bytes
    section = efficiency_section(points, 4800.0, 1)
    assert section["per_sequence_s"]["bf16"] == 0.0
    assert all(section[t]["bf16"] >= 0 for t in ("overhead_s", "per_context_token_s"))
    small = _kernel_points(per_byte, 12e-6, 0.3e-6, 0.3e-9, batches=(16, 32), contexts=(16384, 32768))
    section = efficiency_section(small, 4800.0, 1)
    assert section["per_sequence_s"]["bf16"] == 0.0 and section["per_context_token_s"]["bf16"] == 0.0
    assert section["overhead_s"]["bf16"] > 0


def test_attention_seconds_adds_the_sequence_and_context_terms():
    """sizing's kernel time by hand: 12 us + 1 GB / (4,800 GB/s x 0.8) + 16 x 0.3 us + 16,384 x 0.3 ns."""
    from types import MappingProxyType

    from sizing.efficiency import DecodeEfficiency

    from sizing.planners.speed import attention_seconds

    eff = DecodeEfficiency(kv=MappingProxyType({"bf16": 0.8}), overhead_s=MappingProxyType({"bf16": 12e-6}),
                           per_sequence_s=MappingProxyType({"bf16": 0.3e-6}),
                           per_context_token_s=MappingProxyType({"bf16": 0.3e-9}))
    expected = 12e-6 + 1e9 / (4800e9 * 0.8) + 16 * 0.3e-6 + 16384 * 0.3e-9
    assert attention_seconds(10**9, 4800.0, eff, "bf16", sequences=16, context_tokens=16384) == \
        pytest.approx(expected, rel=1e-12)
    # a format without fitted terms: bandwidth only, at the default efficiency
    assert attention_seconds(10**9, 4800.0, eff, "q4_0", sequences=16, context_tokens=16384) == \
        pytest.approx(1e9 / (4800e9 * eff.kv_default), rel=1e-12)


def test_efficiency_profile_takes_each_format_from_the_report_named_for_it(capsys):
    """A later run updates only the formats it is named for; a format the report lacks is a
    one-line error."""
    from measure.kernel_bench import efficiency_profile, efficiency_section, main

    def report(kv_bf16, kv_nvfp4):
        points = _kernel_points(1 / (kv_bf16 * 4800e9), 12e-6, 0.3e-6, 0.3e-9) + [
            dict(p, format="nvfp4") for p in _kernel_points(1 / (kv_nvfp4 * 4800e9), 12e-6, 0.3e-6, 0.3e-9)]
        return dict(device=dict(name="GPU", torch="t", triton="tr", cuda="c"),
                    decode_efficiency=efficiency_section(points, 4800.0, 1))

    profile = efficiency_profile([("first.json", report(0.9, 0.3)), ("later.json", report(0.8, 0.5))],
                                 [None, {"nvfp4"}])
    assert profile["kv"] == {"bf16": 0.9, "nvfp4": 0.5}
    assert profile["measured_in"] == {"bf16": "first.json", "nvfp4": "later.json"}
    with pytest.raises(ValueError, match="later.json has no fitted kivi4"):
        efficiency_profile([("later.json", report(0.8, 0.5))], [{"kivi4"}])
    assert main([str(ROOT / "measure" / "reports" / "h200-decode-kernels-kivi-window.json") + ":nvfp4"]) == 2
    assert "has no fitted nvfp4" in capsys.readouterr().err


def test_the_replica_falls_back_to_eager_attention_where_sdpa_is_not_offered():
    # gpt-oss's transformers class offers no SDPA: the harness builds its eager attention instead of
    # skipping the model (built on the meta device: no GPU, no memory)
    from transformers import AutoConfig

    from measure.run import build_replica, model_shape

    for name, expected in (("gpt-oss-20b", "eager"), ("llama-3.1-8b", "sdpa")):
        config, _ = model_shape(name, 2)
        hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "quantization_config"})
        _, attention = build_replica(hf_config)
        assert attention == expected, name


def test_validate_counts_points_that_were_not_measured(tmp_path, capsys):
    import json

    from app.cli import main
    from conftest import ROOT

    report = json.loads((ROOT / "measure" / "reports" / "h100-capacity.json").read_text())
    report["skipped"] = [dict(kind="capacity", item=["gpt-oss-20b", 2], reason="ValueError: no SDPA")]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert main(["validate", str(path)]) == 1
    assert "1 requested point(s) were not measured" in capsys.readouterr().err


def test_the_minicpm3_replica_builds_with_its_longrope_scaling(monkeypatch):
    # MiniCPM3's rope scaling is longrope: short and long factor lists, no 'factor'. transformers 5.17
    # (vLLM 0.26's environment) builds MiniCPM3's attention reading rope_parameters["factor"] for any
    # rope type but default, so the replica of the file's config failed there with KeyError: 'factor'
    # (newer releases read it only with mscale_all_dim). The harness hands transformers the factor
    # transformers and vLLM derive for longrope (max_position_embeddings over the pretraining length).
    modeling = pytest.importorskip("transformers.models.minicpm3.modeling_minicpm3")
    from transformers import AutoConfig

    from measure.run import build_replica, replica_config

    def yarn_apply_mscale_of_5_17(rope_parameters, scaling):
        if rope_parameters.get("rope_type", "default") != "default":
            mscale_all_dim = rope_parameters.get("mscale_all_dim", 0)
            scaling_factor = rope_parameters["factor"]
            if mscale_all_dim:
                mscale = modeling.yarn_get_mscale(scaling_factor, mscale_all_dim)
                scaling = scaling * mscale * mscale
        return scaling

    monkeypatch.setattr(modeling, "yarn_apply_mscale", yarn_apply_mscale_of_5_17)
    config, _ = model_shape("minicpm3-4b", 2)
    with pytest.raises(KeyError, match="factor"):  # the failure of the GPU run, reproduced
        build_replica(AutoConfig.for_model(**{k: v for k, v in copy.deepcopy(config).items()
                                              if k != "quantization_config"}))
    hf_config = AutoConfig.for_model(**replica_config(config))
    model, attention = build_replica(hf_config)
    assert attention == "sdpa" and "factor" not in config["rope_scaling"]  # the bundled config is not changed
    assert hf_config.rope_parameters["rope_type"] == "longrope" and hf_config.rope_parameters["factor"] == 1.0
    # as vLLM builds it: softmax scale qk_head_dim ** -0.5 (no mscale), longrope's cos/sin unscaled at 32K of 32K
    assert model.model.layers[0].self_attn.scaling == (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5
    assert model.model.rotary_emb.attention_scaling == 1.0


LONGROPE = {"short_factor": [1.0] * 16, "long_factor": [2.0] * 16}


@pytest.mark.parametrize("config, factors", [
    # the file's rope_scaling with the old 'type' key; the pretraining length inside it
    ({"max_position_embeddings": 131072, "rope_scaling": {"type": "longrope", **LONGROPE,
                                                          "original_max_position_embeddings": 4096}}, [32.0]),
    # the config's own original_max_position_embeddings comes first (Phi-3, as standardize_rope_params takes it)
    ({"max_position_embeddings": 131072, "original_max_position_embeddings": 8192,
      "rope_scaling": {"rope_type": "longrope", **LONGROPE, "original_max_position_embeddings": 4096}}, [16.0]),
    # transformers 5's rope_parameters, one dict per layer type
    ({"max_position_embeddings": 65536, "rope_parameters": {
        "full_attention": {"rope_type": "longrope", **LONGROPE, "original_max_position_embeddings": 32768},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}, [2.0]),
    # a multimodal config's text model
    ({"text_config": {"max_position_embeddings": 32768, "rope_parameters": {"rope_type": "longrope", **LONGROPE}}},
     [1.0]),
    # a factor the file gives is kept; other kinds are left alone
    ({"max_position_embeddings": 131072, "rope_scaling": {"type": "longrope", **LONGROPE, "factor": 4.0,
                                                          "original_max_position_embeddings": 4096}}, [4.0]),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, [4.0]),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0}}, [None]),
])
def test_the_replica_config_reads_rope_scaling_as_transformers_does(config, factors):
    from measure.run import replica_config

    before = copy.deepcopy(config)
    out = replica_config({**config, "quantization_config": {"quant_method": "mxfp4"}})
    assert config == before and "quantization_config" not in out
    level = out.get("text_config", out)
    params = level.get("rope_parameters") or level.get("rope_scaling")
    entries = [v for v in params.values() if isinstance(v, dict)] or [params]
    assert [e.get("factor") for e in entries if e.get("rope_type", e.get("type")) != "default"] == factors


class _FakeNvml:
    def __init__(self):
        self.asked = []

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.asked.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self.asked.append(("pci", bus))
        return bus

    def nvmlDeviceGetHandleByIndex(self, index):
        self.asked.append(("index", index))
        return index


def _fake_torch(**props):
    from types import SimpleNamespace

    cuda = SimpleNamespace(current_device=lambda: 0, get_device_properties=lambda i: SimpleNamespace(**props))
    return SimpleNamespace(cuda=cuda)


def test_nvml_reads_the_gpu_torch_uses_not_the_one_of_its_index(monkeypatch):
    # With CUDA_VISIBLE_DEVICES=2, torch's device 0 is the host's GPU 2 and NVML's index 0 its GPU 0: an H200
    # run read GPU 0 (another process's 33 GB) and wrote -8.3 GB outside torch and 0 B taken by a 40 MiB pool
    from measure.run import non_torch_bytes, nvml_handle

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    nvml = _FakeNvml()
    assert nvml_handle(nvml, _fake_torch(uuid="58f3ac3e-0d4b-11f0-8c1b-0242ac120002")) == \
        "GPU-58f3ac3e-0d4b-11f0-8c1b-0242ac120002"
    assert nvml_handle(nvml, _fake_torch(pci_bus_id=0x19, pci_device_id=0, pci_domain_id=0)) == "00000000:19:00.0"
    with pytest.raises(KvsizeError, match="which NVML device is torch's"):
        nvml_handle(nvml, _fake_torch())
    assert ("index", 0) not in nvml.asked
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_handle(nvml, _fake_torch()) == 0  # CUDA sees every GPU: the indices agree
    assert non_torch_bytes(35_000_000_000, 9_000_000_000, 24_500_000_000) == 1_500_000_000
    with pytest.raises(KvsizeError, match="did not read this process's GPU"):
        non_torch_bytes(33_965_408_256, 9_000_000_000, 33_311_162_368)
    with pytest.raises(KvsizeError, match="through NVML"):
        non_torch_bytes(None, 9_000_000_000, 0)


def _report(name):
    return json.loads((ROOT / "measure" / "reports" / name).read_text())


def _without_a_gpu(report):
    # what a report computed on a CPU would hold: no NVIDIA device, no NVML, kvsize's predictions as readings
    report["device"] = {"name": "cpu", "total_bytes": report["device"]["total_bytes"], "torch": "2.11.0+cpu"}
    for p in report["allocation"]:
        p.update(allocated_delta_bytes=p["storage_bytes"], reserved_delta_bytes=p["storage_bytes"],
                 nvml_delta_bytes=None)
    for p in report["capacity"]:
        p["measured"].update(weights_bytes=p["predicted"]["weights_bytes"],
                             activation_bytes=p["predicted"]["activation_bytes"])
        p["nvml_before_bytes"] = None


@pytest.mark.parametrize("change, needle", [
    (_without_a_gpu, "is no NVIDIA GPU kvsize bundles"),
    (_without_a_gpu, "no NVML reading before the replica was built"),
    (_without_a_gpu, "are kvsize's prediction to the byte"),
    (lambda r: r["device"].update(name="NVIDIA GeForce GTX 1080"), "is no NVIDIA GPU kvsize bundles"),
    (lambda r: r["device"].pop("driver"), "has no NVIDIA driver version or NVML total"),
    (lambda r: r["device"].update(nvml_total_bytes=None), "has no NVIDIA driver version or NVML total"),
    (lambda r: r["device"].update(total_bytes=85017493504), "CUDA's total 85017493504 B is not the bundled GPU's"),
    (lambda r: r["device"].update(nvml_total_bytes=150754820096 + 2**20), "NVML's total"),
    (lambda r: r["capacity"][0].update(total_bytes=r["capacity"][0]["total_bytes"] - 2**30), "sized for a total"),
    # NVML read another GPU than torch's: nothing taken for the pool, less than nothing outside torch
    (lambda r: r["allocation"][0].update(nvml_delta_bytes=0), "NVML saw 0 B taken while torch reserved"),
    (lambda r: r["allocation"][0].update(nvml_delta_bytes=None), "NVML saw None B taken"),
    (lambda r: r["capacity"][0]["measured"].update(non_torch_bytes=-8332050432), "B outside torch"),
    (lambda r: r["capacity"][0]["measured"].update(non_torch_bytes=0), "0 B outside torch"),
    (lambda r: r["allocation"][0].update(reserved_delta_bytes=r["allocation"][0]["reserved_delta_bytes"] + 512),
     "no torch allocator reading"),
    (lambda r: r["allocation"][0].pop("allocated_delta_bytes"), "no torch allocator reading"),
    (lambda r: r["capacity"][0]["boundary"].pop("peak_reserved_bytes"), "reserved peak None B"),
    (lambda r: r["capacity"][0].pop("nvml_before_bytes"), "no NVML reading before the replica was built"),
    (lambda r: r["capacity"][0]["measured"].update(weights_bytes=r["capacity"][0]["predicted"]["weights_bytes"],
                                                   activation_bytes=r["capacity"][0]["predicted"]["activation_bytes"]),
     "are kvsize's prediction to the byte"),
])
def test_validate_rejects_a_report_not_read_from_a_gpu(change, needle):
    report = _report("h200-capacity.json")
    assert check_report(report) == []
    change(report)
    assert any(needle in line for line in check_report(report)), check_report(report)


def test_a_report_computed_without_a_gpu_fails_kvsize_validate(tmp_path, capsys):
    from app.cli import main

    report = _report("h100-capacity.json")
    _without_a_gpu(report)
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(report))
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "device 'cpu' is no NVIDIA GPU" in err and "Traceback" not in err


MINICPM3 = ROOT / "measure" / "reports" / "h200-harness-minicpm3-4b.json"


def test_the_harness_reads_the_weight_tensors_apart_from_the_allocator():
    # MiniCPM3-4B's replica on an H200: 749 tensors of 8,147,752,072 B, which the allocator counted as
    # 8,312,314,368 B (each 31.25 MiB MLP projection keeps the 0.75 MiB end of its 32 MiB segment);
    # kvsize's tensors are within 0.5% of the first, the figure vLLM's budget takes is the second
    from measure.validate import allocator_slack_bytes

    point = LOADED[MINICPM3]["capacity"][0]
    m, sizes = point["measured"], point["weight_tensor_sizes_bytes"]
    assert sum(sizes) == m["weights_tensor_bytes"] < m["weights_bytes"]
    assert m["weights_bytes"] - m["weights_tensor_bytes"] <= sum(allocator_slack_bytes(s) for s in sizes)
    assert check_report(LOADED[MINICPM3]) == []


@pytest.mark.parametrize("tamper, message", [
    (lambda p: p["weight_tensor_sizes_bytes"].__setitem__(0, p["weight_tensor_sizes_bytes"][0] + 512), "weight tensors hold"),
    (lambda p: p.pop("weight_tensor_sizes_bytes"), "without the size of each weight tensor"),
    (lambda p: p["measured"].__setitem__("weights_tensor_bytes", p["measured"]["weights_bytes"] + 1), "weight tensors hold"),
])
def test_a_weight_tensor_figure_that_does_not_add_up_is_rejected(tamper, message):
    bad = copy.deepcopy(LOADED[MINICPM3])
    tamper(bad["capacity"][0])
    assert any(message in p for p in check_report(bad))


def test_an_allocator_figure_beyond_what_rounding_can_add_is_rejected():
    from measure.validate import allocator_slack_bytes

    bad = copy.deepcopy(LOADED[MINICPM3])
    point = bad["capacity"][0]
    sizes = point["weight_tensor_sizes_bytes"]
    point["measured"]["weights_bytes"] = point["measured"]["weights_tensor_bytes"] + sum(
        allocator_slack_bytes(s) for s in sizes) + 1
    assert any("allocator counted" in p for p in check_report(bad))
    # and below the tensors themselves
    point["measured"]["weights_bytes"] = point["measured"]["weights_tensor_bytes"] - 1
    assert any("allocator counted" in p for p in check_report(bad))


def test_allocator_slack_follows_the_caching_allocators_rules():
    # c10/cuda/CUDACachingAllocator.cpp: requests round up to 512 B; an unsplit end is under 512 B in the
    # small pool (up to 1 MiB), up to 1 MiB in the large pool
    from measure.validate import allocator_slack_bytes

    assert allocator_slack_bytes(4) == 508 + 511
    assert allocator_slack_bytes(2**20) == 511
    assert allocator_slack_bytes(32_768_000) == 2**20


def test_the_validation_page_plots_the_tensors_against_kvsizes_tensors():
    # capacity v3: the page's weights point is the replica's tensors against kvsize's tensors (what validate
    # holds to 0.5%), not the allocator's count of vLLM's merged tensors against the replica's tensors
    pytest.importorskip("pandas")
    from app.views.validation import report_points

    df = report_points(LOADED[MINICPM3])
    row = df[df["kind"] == "weights_tensor_bytes (measured)"].iloc[0]
    assert row["measured"] == 8_147_752_072 and abs(row["error_%"]) < 0.5
