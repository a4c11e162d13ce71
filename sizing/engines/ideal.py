"""No engine: each layer holds exactly min(tokens, its window) of each sequence, with no paging, under the
headroom the user leaves; the reference the engines' rules are compared with."""

from __future__ import annotations

from .base import Engine, exact_pool, headroom_budget


IDEAL = Engine("ideal", None, 0.0, None, 1, False, headroom_budget, exact_pool,
               "no engine: each layer holds exactly min(tokens, its window); KIVI keeps its fp16 residual")
