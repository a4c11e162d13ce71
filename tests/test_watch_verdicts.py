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
