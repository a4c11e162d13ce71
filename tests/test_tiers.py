"""Tiers and links: the link fit, and the transfer reports measured on H100 and H200 (measure/reports)."""

import copy
import json
from pathlib import Path

import pytest

from sizing.errors import KvsizeError
from sizing.tiers import LinkFit, fit_link, host_transfer_from_report, peer_link_from_report

REPORTS = Path(__file__).parent.parent / "measure" / "reports"
TRANSFER_REPORTS = sorted(REPORTS.glob("*transfer*.json"))


def test_fit_link_recovers_a_known_link():
    # 10 us to start, 1 us per further transfer, 50 GB/s: t = 1e-5 + (k - 1) * 1e-6 + bytes / 5e10
    link = LinkFit(1e-5, 1e-6, 5e10, "made up")
    points = [(b, k, link.seconds(b, k)) for b in (1 << 20, 1 << 24, 1 << 28) for k in (1, 4, 16)]
    fitted = fit_link(points, "made up")
    assert fitted.latency_s == pytest.approx(1e-5, rel=1e-9)
    assert fitted.per_transfer_s == pytest.approx(1e-6, rel=1e-9)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(5e10, rel=1e-9)
    # one transfer per point: no per-transfer term to fit
    single = fit_link([(b, link.seconds(b)) for b in (1 << 20, 1 << 30)], "made up")
    assert single.per_transfer_s == 0 and single.bandwidth_bytes_per_s == pytest.approx(5e10, rel=1e-9)


@pytest.mark.parametrize("points", [[(1 << 20, 1e-4)], [(1 << 20, 0.0), (1 << 21, 1e-4)],
                                    [(1 << 20, 1e-4), (1 << 20, 1e-4)]])
def test_fit_link_refuses_points_it_cannot_fit(points):
    with pytest.raises(KvsizeError):
        fit_link(points, "bad")


def test_measured_host_links_are_pcie_gen5():
    # measure/reports/h100-host-transfer.json, h200-host-transfer.json: both GPUs report a PCIe 5.0 x16
    # link; pinned copies sustain 54.5-54.6 GB/s each way (the link's 63 GB/s raw, less protocol overhead).
    for name in ("h100-host-transfer.json", "h200-host-transfer.json"):
        report = json.loads((REPORTS / name).read_text())
        assert (report["device"]["pcie_generation"], report["device"]["pcie_width"]) == (5, 16)
        model = host_transfer_from_report(report, name)
        for link in (model.d2h, model.h2d):
            assert 50e9 < link.bandwidth_bytes_per_s < 63e9
            assert link.latency_s < 50e-6


def test_measured_nvlink_peer_link():
    # measure/reports/h200x2-peer-transfer.json: two H200s over NVLink (NV18), NCCL 2.28.9 send/recv.
    report = json.loads((REPORTS / "h200x2-peer-transfer.json").read_text())
    link = peer_link_from_report(report, "peer")
    assert 300e9 < link.bandwidth_bytes_per_s < 450e9  # H200 NVLink 4: 450 GB/s per direction, raw


@pytest.mark.parametrize("path", TRANSFER_REPORTS, ids=lambda p: p.name)
def test_transfer_times_raised_20_percent_are_rejected(path):
    from measure.validate import checked

    report = json.loads(path.read_text())
    assert checked(report, None) == []
    slower = copy.deepcopy(report)
    section = "host_paged" if "host_paged" in slower else "peer_layered"
    for p in slower[section]:
        p["seconds"] *= 1.2
    problems = checked(slower, None)
    assert len(problems) == len(slower[section])


def test_a_transfer_point_with_the_wrong_bytes_is_rejected():
    from measure.validate import checked

    report = json.loads((REPORTS / "h200-host-transfer.json").read_text())
    report["host_paged"][0]["bytes"] += 1
    assert any("the layout holds" in p for p in checked(report, None))
