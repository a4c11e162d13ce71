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
from sizing.formats import FORMAT_NAMES  # noqa: E402
from sizing.layers import build_layout  # noqa: E402

REPORTS = sorted((ROOT / "measure" / "reports").glob("*.json"))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("model", ["llama-3.1-8b:2", "deepseek-v2:2", "gpt-oss-20b:2"])
def test_real_tensors_hold_the_predicted_bytes(fmt, model):
    name, layers = model.split(":")
    _, shape = model_shape(name, int(layers))
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
    assert check_report(json.loads(path.read_text())) == []


def test_tampered_report_fails_validation():
    report = json.loads((ROOT / "measure" / "reports" / "h200-capacity.json").read_text())
    bad = copy.deepcopy(report)
    bad["capacity"][0]["measured"]["num_blocks"] = int(bad["capacity"][0]["measured"]["num_blocks"] * 0.95)
    problems = check_report(bad)
    assert problems and "num_blocks" in problems[0]


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
    assert len(problems) == 1 and "bf16 b16 ctx32768" in problems[0] and "predicted" in problems[0]
    wrong_bytes = copy.deepcopy(report)
    next(p for p in wrong_bytes["kernels"] if p["format"] == "nvfp4")["bytes_read"] += 1
    assert any("sizing's layout holds" in line for line in check_report(wrong_bytes))
