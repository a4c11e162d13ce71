"""Stage 5, planners: fleets, latency-target designs, KV tiers and sweeps, built on capacity and the speed
model (docs/architecture.md)."""
