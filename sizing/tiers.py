"""KV cache tiers beyond HBM and the links between them: how much each tier holds, how long a
session takes to come back, and whether bringing it back beats computing its prefill again.

A link is `seconds = transfers × latency + bytes / bandwidth` (LinkFit). Its two numbers come from
a measurement report (`measure/transfer.py`, fitted by fit_link) or, for links not measured, from
the sourced figures in profiles/links.json. Offloading a session gathers its blocks in HBM and
copies them over the link; reloading copies them back and scatters them (HostTransfer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import KvsizeError


@dataclass(frozen=True)
class LinkFit:
    """A link: a start latency, a cost for each further transfer in a batch, and a sustained rate."""

    latency_s: float
    per_transfer_s: float
    bandwidth_bytes_per_s: float
    source: str

    def seconds(self, nbytes: int, transfers: int = 1) -> float:
        return self.latency_s + (transfers - 1) * self.per_transfer_s + nbytes / self.bandwidth_bytes_per_s


def fit_link(points: Iterable[tuple], source: str) -> LinkFit:
    """A link from (bytes, seconds) or (bytes, transfers, seconds) points, minimising the squared
    relative error of `latency + (transfers − 1) × per_transfer + bytes / bandwidth` (weighted linear
    least squares in latency, per_transfer and 1 / bandwidth; per_transfer is 0 where every point is
    one transfer)."""
    pts = [(float(p[0]), float(p[1]) if len(p) == 3 else 1.0, float(p[-1])) for p in points]
    if len(pts) < 2 or any(not (b > 0 and k >= 1 and t > 0 and math.isfinite(b) and math.isfinite(t))
                           for b, k, t in pts):
        raise KvsizeError(f"{source}: a link fit needs at least two points of positive bytes and seconds")
    batched = len({k for _, k, _ in pts}) > 1
    rows = [((1.0, k - 1, b) if batched else (1.0, b), t) for b, k, t in pts]
    solution = _weighted_least_squares(rows)
    if solution is None:
        raise KvsizeError(f"{source}: the points do not span enough sizes to fit a link")
    latency, per_transfer, inverse = (solution if batched else (solution[0], 0.0, solution[1]))
    if inverse <= 0:
        raise KvsizeError(f"{source}: the fitted bandwidth is not positive")
    return LinkFit(max(latency, 0.0), max(per_transfer, 0.0), 1 / inverse, source)


def _weighted_least_squares(rows: list[tuple[tuple[float, ...], float]]) -> tuple[float, ...] | None:
    """x minimising sum((row · x / t − 1)^2): the normal equations, solved by Gaussian elimination."""
    n = len(rows[0][0])
    a = [[sum(r[i] * r[j] / t**2 for r, t in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] / t for r, t in rows) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
                b[r] -= f * b[col]
    return tuple(b[i] / a[i][i] for i in range(n))


@dataclass(frozen=True)
class HostTransfer:
    """HBM <-> host memory for paged KV: a gather (or scatter) in HBM and one copy over the link."""

    d2h: LinkFit
    h2d: LinkFit
    hbm: LinkFit

    def offload_seconds(self, nbytes: int) -> float:
        return self.hbm.seconds(nbytes) + self.d2h.seconds(nbytes)

    def reload_seconds(self, nbytes: int) -> float:
        return self.h2d.seconds(nbytes) + self.hbm.seconds(nbytes)


def host_transfer_from_report(report: dict, name: str) -> HostTransfer:
    """The fits of a `measure.transfer host` report's contiguous sweeps."""
    by_direction = {d: [(p["bytes"], p["seconds"]) for p in report["host_contiguous"] if p["direction"] == d]
                    for d in ("d2h", "h2d")}
    device = report.get("device", {}).get("name", "?")
    return HostTransfer(
        d2h=fit_link(by_direction["d2h"], f"{name}: HBM to pinned host on {device}"),
        h2d=fit_link(by_direction["h2d"], f"{name}: pinned host to HBM on {device}"),
        hbm=fit_link([(p["bytes"], p["seconds"]) for p in report["hbm_contiguous"]], f"{name}: HBM copy on {device}"),
    )


# NCCL moves small messages with other protocols (LL, LL128) whose cost per send differs; the peer
# link is fitted on, and applies to, sends of at least this size (a request's KV per layer from
# about 8K prompt tokens on an 8B model).
PEER_FIT_MIN_MESSAGE_BYTES = 8 << 20


def peer_link_from_report(report: dict, name: str) -> LinkFit:
    device = report.get("device", {}).get("name", "?")
    points = [(p["bytes"], p.get("transfers", 1), p["seconds"]) for p in report["peer_contiguous"]
              if p["bytes"] // p.get("transfers", 1) >= PEER_FIT_MIN_MESSAGE_BYTES]
    return fit_link(points, f"{name}: NCCL send/recv between two {device} GPUs (sends of "
                            f"{PEER_FIT_MIN_MESSAGE_BYTES >> 20} MiB or more)")


def layered_send_seconds(link: LinkFit, layer_bytes: list[int]) -> float:
    """A request's KV sent one layer at a time (layer-wise P/D connectors): one transfer per layer."""
    return link.seconds(sum(layer_bytes), transfers=len(layer_bytes))
