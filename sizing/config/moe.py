"""Mixture-of-experts: routed experts and the experts each token is routed to (under every spelling), shared
experts, and which layers are MoE (first_k_dense_replace, moe_layer_freq, decoder_sparse_step, ...)."""

from __future__ import annotations

from ..errors import KvsizeError
from .fields import Fields, as_int
from .reading import Reading

# Experts each token is routed to, under every spelling a published config uses (Mixtral/Qwen, gpt-oss,
# Hunyuan, Gemma 4, DeepSeek's n_activated in its reference configs)
TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "top_k_experts", "moe_topk",
                "n_activated_experts", "num_activated_experts", "num_experts_per_token", "num_selected_experts")

# every config field this module's readers look up
FIELDS = (*TOP_K_FIELDS, "decoder_sparse_step", "first_k_dense_replace", "interleave_moe_layer_step",
          "intermediate_size_mlp", "mlp_only_layers", "moe_intermediate_size", "moe_layer_freq", "moe_layers",
          "moe_num_experts", "moe_shared_expert_intermediate_size", "n_routed_experts", "n_shared_experts",
          "num_experts", "num_local_experts", "shared_expert_intermediate_size")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = (*TOP_K_FIELDS, "decoder_sparse_step", "first_k_dense_replace", "mlp_only_layers", "moe_layer_freq",
                 "moe_shared_expert_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size")


def read_experts(r: Reading) -> None:
    f = r.f
    num_experts = as_int(f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts",
                               default=0), "num_experts")
    top_k = as_int(f.get(*TOP_K_FIELDS, default=0), "num_experts_per_tok")
    if num_experts and not top_k:
        # the fused-MoE workspace is sized by the experts each token is routed to: never a silent zero
        r.notes.append(f"config.json names {num_experts} experts but no experts-per-token field kvsize reads "
                       f"({', '.join(TOP_K_FIELDS)}); the MoE workspace of the profiling run is left out")
    r.num_experts, r.top_k = num_experts, top_k
    r.moe_inter = as_int(f.get("moe_intermediate_size", default=r.intermediate), "moe_intermediate_size")
    r.moe_layers = _moe_layers(f, r.num_layers, num_experts, r.blocks)


def _moe_layers(f: Fields, num_layers: int, num_experts: int, blocks: list[str] | None) -> set[int]:
    if not num_experts:
        return set()
    if blocks is not None:
        return {i for i, b in enumerate(blocks) if b == "moe"}
    explicit = f.get("moe_layers")
    if isinstance(explicit, (list, tuple)):
        return {int(i) for i in explicit}
    freq = f.get("moe_layer_freq", default=1)
    if isinstance(freq, (list, tuple)):  # one 0/1 flag per layer (MiMo-V2-Flash)
        if len(freq) != num_layers or any(x not in (0, 1) for x in freq):
            raise KvsizeError(f"config.json: moe_layer_freq as a list needs one 0 or 1 per layer ({num_layers})")
        return {i for i, x in enumerate(freq) if x == 1}
    first_dense = as_int(f.get("first_k_dense_replace", default=0), "first_k_dense_replace")
    freq = as_int(freq, "moe_layer_freq", 1)
    step = as_int(f.get("decoder_sparse_step", "interleave_moe_layer_step", default=1), "decoder_sparse_step", 1)
    dense_only = set(f.get("mlp_only_layers", default=[]) or [])
    return {
        i for i in range(num_layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    }


def shared_expert_params(f: Fields, hidden: int, moe_inter: int, intermediate: int, matrices: int) -> int:
    """Shared experts: gated (3 matrices) or, like the routed experts of relu² MoEs (Nemotron 3), ungated (2)."""
    shared = f.get("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
    if shared:
        # the size given is all the shared experts' width (Qwen2-MoE, Nemotron 3 with n_shared_experts 1)
        as_int(f.get("n_shared_experts", default=1), "n_shared_experts", 0)
        return matrices * hidden * int(shared) + hidden  # plus the shared-expert gate
    n_shared = f.get("n_shared_experts")
    if n_shared:
        return matrices * hidden * moe_inter * int(n_shared)
    if f.get("interleave_moe_layer_step") is not None:  # Llama 4: one shared expert of intermediate_size
        return matrices * hidden * intermediate
    return 0


def dense_intermediate(f: Fields, intermediate: int, num_experts: int) -> int:
    if num_experts and f.get("intermediate_size_mlp") is not None:  # Llama 4's dense layers
        return int(f.get("intermediate_size_mlp"))
    return intermediate
