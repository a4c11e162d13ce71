"""Pool to concurrency: how many requests of a length, or how long a context at a concurrency, a KV budget
holds in an engine's pool (docs/formulas.md, 'Capacity'). Pure arithmetic on the pool's units."""

from __future__ import annotations

from functools import lru_cache

from ..engines import Pool


def units_for(pool: Pool, budget_bytes: int) -> int:
    if pool.unit_bytes == 0:
        return 0
    return max(0, (budget_bytes - pool.fixed_bytes) // pool.unit_bytes)


def concurrency_fits(pool: Pool, budget_bytes: int, context_len: int, state_bytes: int, n: int) -> bool:
    remaining = budget_bytes - n * state_bytes
    if remaining < pool.fixed_bytes:
        return False
    return n * pool.request_units(context_len) <= units_for(pool, remaining)


def max_concurrency(pool: Pool, budget_bytes: int, context_len: int, state_bytes: int) -> int:
    request = pool.request_units(context_len)
    per_request = request * pool.unit_bytes + state_bytes
    if per_request == 0:
        return 0
    n = max(0, (budget_bytes - pool.fixed_bytes) // per_request)
    while concurrency_fits(pool, budget_bytes, context_len, state_bytes, n + 1):
        n += 1
    while n > 0 and not concurrency_fits(pool, budget_bytes, context_len, state_bytes, n):
        n -= 1
    return n


@lru_cache(maxsize=8192)
def max_context(pool: Pool, budget_bytes: int, concurrency: int, state_bytes: int, limit: int) -> int:
    """The longest context (up to `limit`) at which `concurrency` sequences fit; 0 if none."""
    if not concurrency_fits(pool, budget_bytes, 1, state_bytes, concurrency):
        return 0
    lo, hi = 1, limit
    if concurrency_fits(pool, budget_bytes, hi, state_bytes, concurrency):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if concurrency_fits(pool, budget_bytes, mid, state_bytes, concurrency):
            lo = mid
        else:
            hi = mid
    return lo
