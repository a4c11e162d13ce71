"""Evidence, a layer above the model: real engine starts, logs and /metrics scrapes held to kvsize's
estimate, and the accuracy figures (docs/architecture.md). The estimate never imports this package."""
