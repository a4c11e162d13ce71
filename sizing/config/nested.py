"""Fields a model keeps in sub-configs of its own: DBRX's attn_config (kv_n_heads, clip_qkv, rope_theta) and
ffn_config (moe_num_experts, moe_top_k, ffn_hidden_size), and its max_seq_len. The reader hands them on under the
names the other families read, so DBRX is sized as the grouped-query MoE it is."""

from __future__ import annotations

from typing import Any

from ..errors import KvsizeError
from .fields import is_architecture
from .reading import Reading

# every config field this module's readers look up
FIELDS = ("attn_config", "ffn_config", "max_seq_len")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = ("attn_config", "ffn_config")

# vLLM's dbrx.py reads these, the model's own config class (transformers' DbrxConfig) builds them
DBRX_MODEL_TYPES = ("dbrx",)
DBRX_ARCHITECTURES = ("DbrxForCausalLM",)

# DBRX's sub-config fields, as the names the family readers look up (vLLM's dbrx.py: DbrxAttention's
# total_num_kv_heads = attn_config.kv_n_heads; FusedMoE(num_experts=moe_num_experts, top_k=moe_top_k,
# intermediate_size=ffn_hidden_size), each expert a GLU of w1, v1, w2; get_rope(max_position=max_seq_len)).
# clip_qkv clamps the fused QKV output in place and rope_theta sets the rotary frequencies: neither changes memory.
_ATTENTION = {"kv_n_heads": "num_key_value_heads"}
_FFN = {"moe_num_experts": "num_local_experts", "moe_top_k": "num_experts_per_tok",
        "ffn_hidden_size": ("moe_intermediate_size", "intermediate_size")}


def read_nested_configs(r: Reading) -> None:
    """DBRX: its attn_config and ffn_config (as transformers' DbrxConfig fills them in, else as the file gives
    them) and max_seq_len, handed on as a last source of fields under the names the family readers read."""
    if not is_architecture(r.raw, r.raw_text, DBRX_MODEL_TYPES, DBRX_ARCHITECTURES):
        return
    flat: dict[str, Any] = {}
    for name, names in (("attn_config", _ATTENTION), ("ffn_config", _FFN)):
        sub = r.f.get(name)
        if sub is None:
            continue
        if not isinstance(sub, dict) and not hasattr(sub, "to_dict"):
            raise KvsizeError(f"config.json field {name!r} must be an object, got {type(sub).__name__}")
        sub = sub if isinstance(sub, dict) else sub.to_dict()
        for key, targets in names.items():
            if sub.get(key) is not None:
                flat.update(dict.fromkeys(targets if isinstance(targets, tuple) else (targets,), sub[key]))
    max_seq_len = r.f.get("max_seq_len")
    if max_seq_len is not None:
        flat["max_position_embeddings"] = max_seq_len
    r.f.sources.append(flat)
