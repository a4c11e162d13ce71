"""Decode time against context per format, from a kernel benchmark report, as PNG (and HTML).

    python benchmarks/plot_decode.py measure/reports/h200-decode-kernels.json docs/decode-h200

Needs plotly and kaleido with a Chrome/Chromium (see README, 'The web app').
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def figures(report: dict):
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    points = [p for p in report["kernels"] if p["head_dim"] == 128 and not p.get("window")]
    batch = 16 if any(p["batch"] == 16 for p in points) else max(p["batch"] for p in points)
    time_fig, bw_fig = go.Figure(), go.Figure()
    for fmt in dict.fromkeys(p["format"] for p in points):
        line = sorted((p for p in points if p["format"] == fmt and p["batch"] == batch), key=lambda p: p["context"])
        ctx = [p["context"] for p in line]
        time_fig.add_scatter(x=ctx, y=[p["median_ms"] for p in line], mode="lines+markers", name=fmt)
        bw_fig.add_scatter(x=ctx, y=[p["pct_of_copy"] for p in line], mode="lines+markers", name=fmt)
    for fig in (time_fig, bw_fig):  # one colour per format: the default palette has ten
        fig.update_layout(colorway=qualitative.Dark24)
    device = report["device"]["name"]
    time_fig.update_layout(
        title=f"Fused paged decode attention, batch {batch}, 32 q / 8 KV heads of 128, one layer ({device})",
        xaxis=dict(title="context length (tokens, log scale)", type="log"),
        yaxis=dict(title="kernel time (ms, log scale)", type="log"), width=1100, height=600)
    bw_fig.update_layout(
        title=f"Bandwidth reached, batch {batch} ({device}; copy {report['copy_bandwidth_gb_s']:,.0f} GB/s = 100%)",
        xaxis=dict(title="context length (tokens, log scale)", type="log"),
        yaxis=dict(title="payload + metadata bytes read / time, % of copy bandwidth", range=[0, 110]),
        width=1100, height=600)
    bw_fig.add_hline(y=80, line_dash="dash", annotation_text="goal: 80% of copy")
    return {"time": time_fig, "bandwidth": bw_fig}


def main(report_path: str, stem: str) -> int:
    from app.chart_export import png_bytes

    report = json.loads(Path(report_path).read_text())
    for name, fig in figures(report).items():
        out = Path(f"{stem}-{name}.png")
        out.write_bytes(png_bytes(fig, width=1100, height=600, scale=1))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
