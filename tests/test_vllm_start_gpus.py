"""Which GPUs the real-engine launcher (measure/vllm_start.py) may start on: the ones CUDA_VISIBLE_DEVICES
lets a process use, matched as CUDA matches them (index or UUID prefix, stopping at the first miss)."""

from measure.vllm_start import visible

ROWS = [{"index": i, "uuid": f"GPU-{i}abc-{i}", "name": "NVIDIA H100 80GB HBM3", "nvml_total_mib": 81559}
        for i in range(4)]


def test_every_gpu_when_unset():
    assert visible(ROWS, None) == ROWS


def test_indices_in_the_order_given():
    assert [r["index"] for r in visible(ROWS, "2,3")] == [2, 3]
    assert [r["index"] for r in visible(ROWS, "3, 1")] == [3, 1]


def test_uuid_prefixes():
    assert [r["index"] for r in visible(ROWS, "GPU-1abc,GPU-0abc-0")] == [1, 0]


def test_cuda_stops_at_the_first_entry_it_cannot_match():
    assert [r["index"] for r in visible(ROWS, "1,7,2")] == [1]
    assert visible(ROWS, "") == []
