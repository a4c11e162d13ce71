"""Pipeline stages as vLLM splits them: its even split, or the layer counts VLLM_PP_LAYER_PARTITION gives
(vllm/distributed/utils.py get_pp_indices), read through --pp-layer-partition."""

import pytest

from helpers import scenario
from sizing.capacity.estimate import estimate
from sizing.capacity.scenario import pp_stages
from sizing.errors import KvsizeError


def test_the_even_split_gives_extra_layers_to_the_stages_before_the_last():
    # get_pp_indices: 30 layers over 4 stages -> 7 each, the 2 extra to the two stages before the last
    assert [len(r) for r in pp_stages(30, 4)] == [7, 8, 8, 7]


def test_a_partition_is_taken_as_given_first_to_last():
    stages = pp_stages(36, 2, (20, 16))
    assert stages == [range(0, 20), range(20, 36)]


@pytest.mark.parametrize("partition, needle", [((20, 15), "adds up to 35 layers, the model has 36"),
                                               ((12, 12, 12), "names 3 stages"),
                                               ((36, 0), "at least one layer")])
def test_a_partition_vllm_refuses_is_refused(partition, needle):
    with pytest.raises(KvsizeError, match=needle):
        pp_stages(36, 2, partition)


def test_the_even_partition_given_by_hand_is_the_default():
    # Qwen3-8B has 36 layers: vLLM's even split over 2 stages is 18,18
    even = estimate(scenario("qwen3-8b", "h100-sxm", max_model_len=8192, pipeline_parallel_size=2).validated())
    given = estimate(scenario("qwen3-8b", "h100-sxm", max_model_len=8192, pipeline_parallel_size=2,
                              pp_layer_partition=(18, 18)).validated())
    assert given.kv_budget_bytes == even.kv_budget_bytes and given.max_tokens == even.max_tokens


def test_a_heavier_stage_sets_a_smaller_pool():
    # 20 layers on the first stage: more weights and more KV a token there, so the tightest stage holds fewer tokens
    even = estimate(scenario("qwen3-8b", "h100-sxm", max_model_len=8192, pipeline_parallel_size=2).validated())
    uneven = estimate(scenario("qwen3-8b", "h100-sxm", max_model_len=8192, pipeline_parallel_size=2,
                               pp_layer_partition=(20, 16)).validated())
    assert uneven.pipeline_stage == 0 and uneven.kv_layers == 20
    assert uneven.max_tokens < even.max_tokens


def test_the_scenario_refuses_a_partition_of_the_wrong_length():
    with pytest.raises(KvsizeError, match="--pipeline-parallel-size is 2"):
        scenario("qwen3-8b", "h100-sxm", pipeline_parallel_size=2, pp_layer_partition=(12, 12, 12)).validated()


@pytest.mark.parametrize("value, needle", [("20,15", "adds up to 35"), ("20,x", "whole number of layers"),
                                           ("18,18,0", "greater than zero")])
def test_the_cli_refuses_a_bad_partition_in_one_line(value, needle, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as code:
        exit_code = main(["estimate", "--model", "qwen3-8b", "--gpu", "h100-sxm", "--max-model-len", "8k",
                          "--pipeline-parallel-size", "2", "--pp-layer-partition", value])
        raise SystemExit(exit_code)
    assert code.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert any(needle in line for line in err) and not any("Traceback" in line for line in err)
