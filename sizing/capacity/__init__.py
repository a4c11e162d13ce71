"""Stage 4, capacity: one server's budget, pool and concurrency for a scenario (docs/architecture.md)."""
