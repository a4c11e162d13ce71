"""Formulas: the sidebar's estimate worked through term by term."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.ui import _downloads, _fmt_bytes, show_error
from sizing.cache.layers import layer_groups
from sizing.capacity.estimate import Estimate
from sizing.capacity.scenario import Scenario
from sizing.capacity.record import to_record
from sizing.units import GiB


def page_formulas(s: Scenario, e: Estimate | None, error: str | None) -> None:
    if e is None:
        show_error(error)
        return
    r, b = to_record(e), e.breakdown
    groups = layer_groups(e.layout, e.max_model_len) if e.layout is not None else []
    terms = " + ".join(f"{g.layers} × {_fmt_bytes(g.payload_bytes_per_token + g.metadata_bytes_per_token)}"
                       for g in groups) or "0"
    st.markdown(f"""
**KV bytes per token** = Σ over the {e.kv_layers} KV layers on this GPU of (K + V bytes per token of the layer),
each layer = heads × (K + V payload and metadata per head per token) = {terms}
= **{r['kv_bytes_per_token']:,} B** (payload {r['kv_payload_bytes_per_token']:,} B + metadata
{r['kv_metadata_bytes_per_token']:,} B; rounded up to whole bytes). Windowed layers count per token only up to
their window; the per-sequence column holds that.
""")
    if groups:
        st.dataframe(pd.DataFrame([dict(
            layers=g.layers, kind=g.kind, window=g.window, kv_heads=g.heads, head_dim=g.head_dim,
            k_format=g.k_format, v_format=g.v_format or "(MLA latent: no V)",
            payload_bytes_per_token=_fmt_bytes(g.payload_bytes_per_token),
            metadata_bytes_per_token=_fmt_bytes(g.metadata_bytes_per_token),
            bytes_per_sequence=g.sequence_bytes) for g in groups]), key="formula_layers")
        _downloads(pd.DataFrame([{k: v for k, v in r.items() if k != "breakdown"} | r["breakdown"]]), None,
                   "formulas")
    st.markdown(f"""
**KV budget** ({e.engine.name}) = {e.budget_formula}
= {b.total_bytes:,} total → **{e.kv_budget_bytes:,} B** ({e.kv_budget_bytes / GiB:.2f} GiB)
with weights {b.weights_bytes:,} B, activation {b.activation_bytes:,} B, non-torch {b.non_torch_bytes:,} B,
CUDA graphs {b.cuda_graph_bytes:,} B.

**Blocks** = ⌊(budget − per-layer tensors) / block bytes⌋ = ⌊({e.kv_budget_bytes:,} − {e.kv_layer_fixed_bytes:,}) / {e.block_bytes:,}⌋ = **{e.num_blocks:,}**
of {e.block_size} tokens → **{e.max_tokens:,} tokens** in cache.

**Per request** at {e.max_model_len:,} tokens: {e.kv_reserved_bytes_per_sequence:,} B reserved by the engine
({e.kv_bytes_per_sequence:,} B exact) → **max concurrency {e.max_concurrency:,}** ({e.max_concurrency_ratio:.2f}×).
""")
