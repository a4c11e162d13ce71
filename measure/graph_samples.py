"""Make a staged vLLM (Model Runner V2, 0.29+) print what its CUDA-graph estimate is made of.

V2's profile_cudagraph_memory (v1/worker/gpu/cudagraph_utils.py) captures every PIECEWISE graph and the two largest
FULL graphs into a throwaway pool, then extrapolates the FULL graphs from those two samples: estimate = measured -
sum(samples) + samples[0] + (FULL graphs - 1) x samples[1]. It prints only the total, so kvsize cannot tell which
part a model moves. This adds one line to the staged copy, after the extrapolation and before anything is returned:

    KVSIZE-GRAPH-SAMPLES measured=<B> samples=[<B>, <B>] full_graphs=<n> piecewise_graphs=<n>

The engine computes and uses the same figures as before; only the print is new. Standard library only: it runs on
the GPU machine against the unpacked stage.

usage: python -m measure.graph_samples SITE_DIR   (the folder holding the staged vllm package)
"""

from __future__ import annotations

import sys
from pathlib import Path

TARGET = Path("vllm/v1/worker/gpu/cudagraph_utils.py")
ANCHOR = "            full_estimate = _extrapolate_full_graph_memory(mem_samples, num_full_graphs)\n"
PROBE = ("            print(f\"KVSIZE-GRAPH-SAMPLES measured={measured} samples={mem_samples} \"\n"
         "                  f\"full_graphs={num_full_graphs} piecewise_graphs=\"\n"
         "                  f\"{len(manager._capture_descs.get(CUDAGraphMode.PIECEWISE, []))}\", flush=True)\n")
MARK = "KVSIZE-GRAPH-SAMPLES"
MIN_PER_GRAPH_BYTES = 1 << 20  # cudagraph_utils.py _MIN_PER_GRAPH_BYTES: the least a further FULL graph is taken at


def v2_estimate_bytes(row: dict) -> int:
    """V2's estimate from a probe line's parts (a row of tests/fixtures/vllm-starts/graph-samples-0.33-h200.json):
    measured - s1 + (FULL graphs - 1) x max(s1, 1 MiB), as _extrapolate_full_graph_memory makes it."""
    s1 = row["samples_bytes"][1]
    return row["measured_bytes"] - s1 + (row["full_graphs"] - 1) * max(s1, MIN_PER_GRAPH_BYTES)


class ProbeError(Exception):
    pass


def probed(text: str) -> str:
    """The source with the print after the extrapolation; the same text where it is there already."""
    if MARK in text:
        return text
    if text.count(ANCHOR) != 1:
        raise ProbeError(f"{TARGET}: expected the line {ANCHOR.strip()!r} once, found it {text.count(ANCHOR)} times: "
                         "this release extrapolates its FULL graphs some other way (V2 runner, 0.29+ only)")
    return text.replace(ANCHOR, ANCHOR + PROBE)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
        return 2
    path = Path(argv[1]) / TARGET
    if not path.is_file():
        print(f"{path}: not found; give the folder that holds the staged vllm package", file=sys.stderr)
        return 2
    try:
        text = probed(path.read_text())
    except ProbeError as e:
        print(e, file=sys.stderr)
        return 2
    part = path.with_suffix(".py.part")
    part.write_text(text)
    part.replace(path)
    print(f"{path}: prints {MARK}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
