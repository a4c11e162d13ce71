"""Stage 4, capacity: one server's budget, pool and concurrency for a scenario (docs/architecture.md).

`from sizing.capacity import Scenario, estimate` is the whole of the model for one server."""

from .estimate import Estimate, estimate
from .record import to_record
from .scenario import Scenario

__all__ = ["Estimate", "Scenario", "estimate", "to_record"]
