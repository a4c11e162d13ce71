"""Stage 2, the cache: KV formats (bytes per value, scales and zero points) and the frozen per-layer specs
that turn a model shape into bytes per token and per block (docs/architecture.md)."""
