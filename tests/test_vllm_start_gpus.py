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


def test_a_stopped_starts_leftover_workers_are_killed_before_the_next_start():
    # vLLM 0.29.0's TP 4 start kept ~131 GiB a GPU after its group was stopped; the launcher frees its own GPUs
    import signal

    from measure.vllm_start import clear_gpus

    held = {"mib": 134_000}
    killed = []

    def kill(pid, sig):
        killed.append((pid, sig))
        held["mib"] = 300  # the driver gives the memory back once the workers are gone

    left = clear_gpus([0, 1], used=lambda ids: held["mib"], processes=lambda ids: [4242, 4243], kill=kill,
                      sleep=lambda s: None)
    assert left == 300
    assert killed == [(4242, signal.SIGKILL), (4243, signal.SIGKILL)]


def test_free_gpus_are_left_alone_and_memory_that_stays_is_reported():
    from measure.vllm_start import GPU_FREE_MIB, clear_gpus

    def no_kill(pid, sig):
        raise AssertionError("nothing to kill on a free GPU")

    assert clear_gpus([2], used=lambda ids: 500, processes=lambda ids: [1], kill=no_kill) == 500
    naps = []
    left = clear_gpus([3], wait_s=5, used=lambda ids: 90_000, processes=lambda ids: [],
                      sleep=lambda s: naps.append(s))
    assert left >= GPU_FREE_MIB and len(naps) == 5  # waited its bound, not forever


def test_the_launcher_hands_its_gpus_back_free(tmp_path):
    # two PP 2 starts on 0.33.0 left workers holding 131 and 32 GiB after their group was stopped; the serving lane
    # that took GPUs 0 and 1 next found 11 GiB free and its servers failed to start
    from measure.vllm_start import _run

    cleared = []
    assert _run([], tmp_path, 10, [0, 1], {}, 110, 2, 300, tmp_path,
                clear=lambda ids: cleared.append(ids) or 0) == []
    assert cleared == [[0, 1]]
