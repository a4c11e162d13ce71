"""Hybrids whose layers are not all attention: Mamba-2 and gated-delta-net (linear attention) layers, which
keep a fixed-size recurrent state per sequence, and NAS models (Llama-Nemotron, DeciLM) whose block_configs
give each layer its own KV heads and FFN width, or none."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KvsizeError
from .fields import Fields, as_int, dtype_name
from .reading import Reading

# every config field this module's readers look up
FIELDS = ("block_configs", "conv_kernel", "d_conv", "d_state", "expand", "linear_conv_kernel_dim",
          "linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
          "mamba_expand", "mamba_head_dim", "mamba_n_groups", "mamba_num_heads", "mamba_ssm_cache_dtype",
          "mamba_ssm_dtype", "n_groups", "ssm_state_size", "state_size")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = ("linear_key_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
                 "mamba_head_dim", "ssm_state_size")


@dataclass(frozen=True)
class NasBlocks:
    """Per-layer blocks of a NAS model (Llama-Nemotron Super/Ultra, DeciLM: block_configs)."""

    kv_heads: tuple[int, ...]  # 0 where the attention is a no-op or a linear layer
    linear_attention: tuple[int, ...]  # 1 where attention is replaced by one hidden x hidden linear layer
    intermediate: tuple[int, ...]  # 0: no FFN; -1: one hidden x hidden linear layer

    def mlp_params(self, layer: int, hidden: int) -> int:
        inter = self.intermediate[layer]
        return hidden * hidden if inter < 0 else 3 * hidden * inter


def read_nas_blocks(r: Reading) -> None:
    r.nas = _nas_blocks(r.f, r.num_layers, r.heads, r.hidden)


def _nas_blocks(f: Fields, num_layers: int, heads: int, hidden: int) -> NasBlocks | None:
    """vllm/model_executor/models/nemotron_nas.py: a layer's KV heads are num_attention_heads //
    n_heads_in_group; no_op attention holds no cache; ffn_mult gives the FFN width
    (_ffn_mult_to_intermediate_size: 2 x ffn_mult x hidden / 3 rounded up to a multiple of 256)."""
    blocks = f.get("block_configs")
    if blocks is None:
        return None
    if not isinstance(blocks, (list, tuple)) or len(blocks) != num_layers:
        raise KvsizeError(f"config.json: block_configs must list one block per layer ({num_layers})")
    kv, linear, inter = [], [], []
    for i, block in enumerate(blocks):
        attention = block.get("attention") if isinstance(block, dict) else None
        ffn = block.get("ffn") if isinstance(block, dict) else None
        if not isinstance(attention, dict) or not isinstance(ffn, dict):
            raise KvsizeError(f"config.json: block_configs[{i}] must hold 'attention' and 'ffn' objects")
        if attention.get("no_op") or attention.get("replace_with_linear"):
            kv.append(0)
            linear.append(1 if attention.get("replace_with_linear") else 0)
        else:
            group = as_int(attention.get("n_heads_in_group"), f"block_configs[{i}].attention.n_heads_in_group", 1)
            if heads % group:
                raise KvsizeError(f"config.json: block_configs[{i}].attention.n_heads_in_group {group} does not "
                                  f"divide num_attention_heads {heads}")
            kv.append(heads // group)
            linear.append(0)
        if ffn.get("no_op"):
            inter.append(0)
        elif ffn.get("replace_with_linear"):
            inter.append(-1)
        else:
            mult = ffn.get("ffn_mult")
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not mult > 0:
                raise KvsizeError(f"config.json: block_configs[{i}].ffn.ffn_mult must be a positive number, got {mult!r}")
            width = int(2 * mult * hidden / 3)
            inter.append(-(-width // 256) * 256)
    return NasBlocks(tuple(kv), tuple(linear), tuple(inter))


def read_nas_kinds(r: Reading) -> None:
    # block_configs decide each layer's kind over any layer pattern: a block with attention keeps full
    # attention's cache, a no-op or linear one keeps none
    if r.nas:
        r.kinds = ["full" if h else "none" for h in r.nas.kv_heads]


def read_recurrent(r: Reading) -> None:
    f, kinds = r.f, r.kinds
    r.state_elements, r.conv_elements, r.state_dtype, r.mixer_params, r.mixer_other = \
        _recurrent(f, r.hidden, r.config_dtype) if "recurrent" in kinds else (0, 0, r.config_dtype, 0, 0)
    r.ssm_dtype_named = (dtype_name(r.f.get("mamba_ssm_dtype")) or "") if "recurrent" in kinds else ""
    r.checkpoint_alignment = GDN_CHECKPOINT_ALIGNMENT if "recurrent" in kinds and \
        f.get("linear_num_value_heads") is not None else 1


# vLLM's FlashInfer gated-delta-net prefill checkpoints every 64 tokens (FLASHINFER_GDN_CHECKPOINT_ALIGNMENT).
GDN_CHECKPOINT_ALIGNMENT = 64


def _recurrent(f: Fields, hidden: int, config_dtype: str) -> tuple[int, int, str, int, int]:
    """(state elements per sequence, of which conv state, SSM state dtype, projection params, other params)
    of one recurrent layer. vLLM keeps the conv state in the model dtype and only the SSM state in
    mamba_ssm_cache_dtype (vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateDtypeCalculator)."""
    state_dtype = dtype_name(f.get("mamba_ssm_dtype", "mamba_ssm_cache_dtype")) or config_dtype
    kernel = as_int(f.get("linear_conv_kernel_dim", "conv_kernel", "d_conv", default=4), "conv_kernel", 1)
    if f.get("linear_num_value_heads") is not None:  # gated delta net (Qwen3-Next, Qwen3.5)
        nk = as_int(f.get("linear_num_key_heads"), "linear_num_key_heads", 1)
        nv = as_int(f.get("linear_num_value_heads"), "linear_num_value_heads", 1)
        dk = as_int(f.get("linear_key_head_dim"), "linear_key_head_dim", 1)
        dv = as_int(f.get("linear_value_head_dim"), "linear_value_head_dim", 1)
        key_dim, value_dim = nk * dk, nv * dv
        conv_dim = 2 * key_dim + value_dim
        state = conv_dim * (kernel - 1) + nv * dk * dv
        projections = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * nv + value_dim * hidden
        other = conv_dim * kernel + 2 * nv + dv
        return state, conv_dim * (kernel - 1), state_dtype, projections, other
    # Mamba-2 (Nemotron-H, Bamba, Jamba-style)
    n_heads = f.get("mamba_num_heads")
    head = f.get("mamba_head_dim")
    d_state = f.get("ssm_state_size", "state_size", "d_state")
    if d_state is None:
        raise KvsizeError("config.json has recurrent layers but no 'ssm_state_size' or 'linear_num_value_heads'")
    d_state = as_int(d_state, "ssm_state_size", 1)
    if n_heads is not None and head is not None:
        d_inner = as_int(n_heads, "mamba_num_heads", 1) * as_int(head, "mamba_head_dim", 1)
    else:
        d_inner = as_int(f.get("mamba_expand", "expand", default=2), "expand", 1) * hidden
        head = f.get("mamba_head_dim", default=64)
        n_heads = d_inner // head
    groups = as_int(f.get("n_groups", "mamba_n_groups", default=1), "n_groups", 1)
    conv_dim = d_inner + 2 * groups * d_state
    state = conv_dim * (kernel - 1) + d_inner * d_state
    projections = hidden * (2 * d_inner + 2 * groups * d_state + n_heads) + d_inner * hidden
    other = conv_dim * kernel + conv_dim + 3 * n_heads + d_inner
    return state, conv_dim * (kernel - 1), state_dtype, projections, other
