"""measure/graph_samples.py: the print it adds to a staged vLLM's V2 CUDA-graph estimate, and its refusal where the
release extrapolates some other way."""

import pytest

from measure.graph_samples import ANCHOR, MARK, ProbeError, probed

# the lines around the extrapolation in vLLM 0.33.0's v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory
SOURCE = ("            num_full_graphs = len(manager._capture_descs.get(CUDAGraphMode.FULL, []))\n" + ANCHOR
          + "            return max(measured - sum(mem_samples) + full_estimate, 0)\n")


def test_the_print_follows_the_extrapolation_and_returns_nothing_new():
    out = probed(SOURCE)
    lines = out.splitlines(keepends=True)
    at = lines.index(ANCHOR)
    assert MARK in lines[at + 1]
    assert lines[-1] == "            return max(measured - sum(mem_samples) + full_estimate, 0)\n"
    assert out.replace("".join(lines[at + 1:-1]), "") == SOURCE


def test_probing_twice_adds_one_print():
    assert probed(probed(SOURCE)).count(MARK) == 1


@pytest.mark.parametrize("source", ["", SOURCE.replace(ANCHOR, ""), SOURCE + ANCHOR])
def test_a_release_without_the_one_extrapolation_is_refused(source):
    with pytest.raises(ProbeError, match="V2 runner"):
        probed(source)
