"""`watch`'s verdicts on figures a plan does not describe: a pool far from the plan's either way, and a plan whose
own pool cannot hold the peak it planned (sizing/evidence/metrics.py watch)."""

import pytest

from sizing.evidence.metrics import POOL_TOLERANCE, EngineMetrics, watch
from sizing.planners.deployment import PlannedPool

# 3,734 blocks of 16 tokens at 8,192 tokens a request: 7 requests of full length
PLAN = PlannedPool(3734, 16, "auto", "bf16", 8192, 7)


def _blocks(engine_blocks: int):
    line = next(x for x in watch(EngineMetrics(num_gpu_blocks=engine_blocks, block_size=16), PLAN, 7)
                if x.figure == "KV blocks")
    return line


@pytest.mark.parametrize("engine_blocks, inside, says", [
    (3734, True, ""),
    (round(3734 * (1 + POOL_TOLERANCE)) - 1, True, ""),
    (5088, False, "more blocks than planned"),  # +36.3%: the plan does not describe this server
    (3000, False, "fewer blocks than planned"),
])
def test_a_pool_far_from_the_plans_either_way_is_outside_it(engine_blocks, inside, says):
    line = _blocks(engine_blocks)
    assert line.inside is inside and says in line.advice


def test_a_plan_that_cannot_hold_its_own_peak_is_not_a_plan_the_running_requests_are_inside():
    lines = {x.figure: x for x in watch(EngineMetrics(running=5), PLAN, 96)}
    assert lines["requests running"].inside is False
    assert "96 requests planned, its pool holds 7 of 8,192 tokens" in lines["requests running"].advice
    held = {x.figure: x for x in watch(EngineMetrics(running=5), PLAN, 7)}
    assert held["requests running"].inside is True


def test_a_plan_of_a_mix_is_held_to_what_its_pool_holds_of_that_mix():
    # 2 replicas of 150 requests of a mix whose full-length requests the pool holds 144 of: the plan's own count
    mix = PlannedPool(3734, 16, "auto", "bf16", 8192, 144, holds_requests=160)
    assert {x.figure: x for x in watch(EngineMetrics(running=150), mix, 150)}["requests running"].inside is True
    short = PlannedPool(3734, 16, "auto", "bf16", 8192, 144, holds_requests=120)
    line = {x.figure: x for x in watch(EngineMetrics(running=100), short, 150)}["requests running"]
    assert line.inside is False and "150 requests planned, its pool holds 120 of its mix" in line.advice


def test_a_plans_deployment_carries_its_mix_and_an_estimates_does_not(tmp_path, capsys):
    import json
    from pathlib import Path

    from app.cli import main

    out = tmp_path / "plan.json"
    example = Path(__file__).parent.parent / "examples" / "workload.yaml"
    assert main(["plan", "--workload", str(example), "--model", "llama-3.1-8b", "--gpus", "h200", "--formats",
                 "fp8", "--tp", "1,2", "--out", str(out)]) == 0
    capsys.readouterr()
    deployment = json.loads(out.read_text())["deployment"]
    assert deployment["concurrency"] <= deployment["holds_requests"]
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--format", "json"]) == 0
    assert "holds_requests" not in json.loads(capsys.readouterr().out)["deployment"]
