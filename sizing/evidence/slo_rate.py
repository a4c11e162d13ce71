"""The most requests per second one replica holds under a latency target (issue 48), read off a server's load points.

A server's points of one prompt/output length pair, ordered by load (closed loop: requests in flight; open loop:
arrivals a second), each give a request rate and the load generator's percentiles. The answer to "how many requests
a second does it hold with TPOT p50 at most 25 ms" is the request rate of the heaviest load that meets the target
before the first load that misses it, moved linearly toward that first miss by the figure that binds (the one whose
line crosses its limit first between the two loads). The lightest load missing answers None; the heaviest meeting
answers "at least" its rate. The same function reads the measured figures and kvsize's simulated ones of the same
points, so the two answers compare like for like.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import KvsizeError

# the load generator's names for the figures a target can bound (`vllm bench serve --metric-percentiles 50,90,99`);
# a point's figures must hold the ones a target names
_KINDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
_PERCENTILES = ("p50", "p90", "p99")


def figure_label(name: str) -> str:
    """`tpot_p50_ms` as a reader says it: 'TPOT p50'."""
    kind, pct, _ = _split(name)
    return f"{_KINDS[kind]} {pct}"


def _split(name: str) -> tuple[str, str, str]:
    parts = name.split("_")
    if len(parts) != 3 or parts[0] not in _KINDS or parts[1] not in _PERCENTILES or parts[2] != "ms":
        raise KvsizeError(f"a target bounds a latency percentile such as 'tpot_p50_ms' or 'ttft_p99_ms', not {name!r}")
    return parts[0], parts[1], parts[2]


@dataclass(frozen=True)
class Target:
    """Upper bounds on latency percentiles, all to be met at once: (('tpot_p50_ms', 25.0), ...)."""

    limits: tuple[tuple[str, float], ...]

    def __post_init__(self):
        if not self.limits:
            raise KvsizeError("a target needs at least one bound")
        for name, value in self.limits:
            _split(name)
            if not value > 0 or math.isinf(value):
                raise KvsizeError(f"the bound on {name} must be a positive number of ms, not {value!r}")

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.limits)

    def label(self) -> str:
        return " and ".join(f"{figure_label(n)} ≤ {v:,g} ms" for n, v in self.limits)

    def met_by(self, point: Mapping[str, float]) -> bool:
        """Whether one point meets every bound (a figure that is not a number misses)."""
        return all(_value(point, n) <= v for n, v in self.limits)


def target(**limits: float) -> Target:
    """target(tpot_p50_ms=25, ttft_p50_ms=1000)."""
    return Target(tuple(limits.items()))


def _value(point: Mapping[str, float], name: str) -> float:
    if name not in point or point[name] is None:
        raise KvsizeError(f"a point has no {name}: the target cannot be read from it")
    value = float(point[name])
    return math.inf if math.isnan(value) else value


@dataclass(frozen=True)
class HeldRate:
    """What a ladder of loads says about the most requests/s held under a target.

    `requests_per_s`: the answer (None when the lightest load already misses; a lower bound when `at_least`).
    `low`, `high`: where the true answer lies if each figure grows with the load: below the lightest load's rate,
    from the heaviest's up, or between the two loads that bracket the crossing. `met`, `missed`: those two loads
    (None where there is none); `binding`: the figure that crosses its bound first between them."""

    requests_per_s: float | None
    at_least: bool
    low: float
    high: float
    met: float | None
    missed: float | None
    binding: str | None

    @property
    def kind(self) -> str:
        return "none" if self.requests_per_s is None else "at least" if self.at_least else "interpolated"

    def readable(self, width: float = 0.2) -> bool:
        """Whether the crossing is bracketed closely enough to be read: the two loads' request rates within
        `width` of each other (0.2: anywhere between them is within 10% of their middle)."""
        return self.kind == "interpolated" and self.high <= self.low * (1 + width)

    def text(self) -> str:
        if self.requests_per_s is None:
            return "none"
        return f"≥ {self.requests_per_s:,.2f}" if self.at_least else f"{self.requests_per_s:,.2f}"


def most_held(points: Sequence[Mapping[str, float]], goal: Target, load: str = "load") -> HeldRate:
    """The most requests/s the points say a replica holds under `goal`.

    Each point holds its `load` (requests in flight, or arrivals a second), its `requests_per_s` and the figures
    the goal bounds. The answer is the request rate of the heaviest load that meets the goal before the first that
    misses, linearly interpolated toward that first miss: for each figure over its bound there, the fraction of the
    way from the last meeting load at which its line reaches the bound; the smallest fraction binds. A lighter load
    whose rate is higher (a closed loop past its peak) keeps its rate."""
    if not points:
        raise KvsizeError("no points to read a held rate from")
    ordered = sorted(points, key=lambda p: p[load])
    if len({p[load] for p in ordered}) != len(ordered):
        raise KvsizeError("two points of one ladder have the same load")
    rates = [float(p["requests_per_s"]) for p in ordered]
    first_miss = next((i for i, p in enumerate(ordered) if not goal.met_by(p)), None)
    if first_miss == 0:
        return HeldRate(None, False, 0.0, rates[0], None, ordered[0][load], _binding_alone(ordered[0], goal))
    if first_miss is None:
        best = max(rates)
        return HeldRate(best, True, best, math.inf, ordered[-1][load], None, None)
    lo, hi = ordered[first_miss - 1], ordered[first_miss]
    fractions = []
    for name, bound in goal.limits:
        below, above = _value(lo, name), _value(hi, name)
        if above > bound:
            fractions.append(((bound - below) / (above - below) if math.isfinite(above) else 0.0, name))
    fraction, binding = min(fractions)
    r_lo, r_hi = rates[first_miss - 1], rates[first_miss]
    answer = max(r_lo + fraction * (r_hi - r_lo), *rates[:first_miss])
    return HeldRate(answer, False, min(r_lo, r_hi), max(r_lo, r_hi), lo[load], hi[load], binding)


def _binding_alone(point: Mapping[str, float], goal: Target) -> str:
    """At the lightest load: the bound missed by the widest margin."""
    return max(goal.limits, key=lambda nv: _value(point, nv[0]) / nv[1])[0]


def compared(measured: HeldRate, kvsize: HeldRate, bar: float = 0.10) -> tuple[float | None, str]:
    """kvsize's answer against the measured one: the signed error (kvsize / measured - 1) where both are read
    between two loads, and 'yes' (within `bar`), 'no' (outside it, or the two ranges apart by more than it), 'both
    none' (the lightest load misses on both sides), 'both ≥' (the heaviest meets on both) or 'unread' (one range too
    open to say)."""
    if measured.kind == "interpolated" and kvsize.kind == "interpolated":
        error = kvsize.requests_per_s / measured.requests_per_s - 1
        return error, "yes" if abs(error) <= bar else "no"
    k_low, k_high = _range(kvsize)
    m_low, m_high = _range(measured)
    if k_high < m_low * (1 - bar) or k_low > m_high * (1 + bar):
        return None, "no"
    if measured.kind == kvsize.kind:
        return None, "both none" if measured.kind == "none" else "both ≥"
    return None, "unread"


def _range(held: HeldRate) -> tuple[float, float]:
    if held.kind == "interpolated":
        return held.requests_per_s, held.requests_per_s
    return held.low, held.high
