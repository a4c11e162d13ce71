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
