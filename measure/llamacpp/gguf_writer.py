"""A KV-faithful miniature GGUF from a Hugging Face config.json.

What llama.cpp sizes its caches from is written as the converter (llama.cpp's convert_hf_to_gguf.py) writes it:
the layer count, query and KV heads, the key and value lengths (written explicitly), the sliding window and its
layer pattern, the MLA ranks, the recurrent (gated delta net) sizes, rope and the context length. What it does not
size them from is made small: an embedding width of 256, an FFN of 256, a vocabulary of 256 dummy tokens and at
most 8 experts, so the file is megabytes. Two exceptions, each forced by the architecture's tensor shapes:
qwen2 and phi3 project the queries to the embedding width, so theirs stays num_heads x head_dim; and deepseek2's
per-head MLA up-projections keep 4 query heads (its cache is one latent per token whatever the heads,
src/llama-model.cpp: n_head_kv 1 under MLA). Weights are zeros: a load sizes memory, it never runs the model.
Projections whose rows are a multiple of 256 are stored as tq1_0 (54 bytes per 256 zeros), the rest as f16 and
norms as f32.

    python -m measure.llamacpp.gguf_writer CONFIG.json OUT.gguf --arch llama

With --full TYPE the file is the model at full size (its real embedding width, FFN and vocabulary), every matrix in
the ggml type TYPE (as convert_hf_to_gguf.py --outtype or llama-quantize --pure write it: 1-D tensors f32), an
output matrix where the config does not tie the embeddings and rope_freqs for llama3 rope scaling, as the converter
writes them; still zeros. gguf and numpy are imported only to write a file: `build` and `tensor_types` need neither.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SMALL = 256  # embedding width, FFN width and vocabulary of a miniature
MAX_EXPERTS = 8  # experts written (each is FFN; none holds cache)
MLA_QUERY_HEADS = 4

# transformers' default max_position_embeddings where a config leaves it out (Gemma3TextConfig: 131072)
DEFAULT_CONTEXT = {"gemma3": 131072}
ARCHES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "deepseek2", "qwen3next")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: a multimodal config's text_config over its top level."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else dict(config)


class _Tensors:
    """Zero tensors by llama.cpp's names and ggml dimensions (ne0 first)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, tuple[int, ...], str]] = []

    def add(self, name: str, ne: tuple[int, ...], kind: str = "w") -> None:
        self.rows.append((name, tuple(int(n) for n in ne), kind))

    def norm(self, name: str, n: int) -> None:
        self.add(name, (n,), "f32")

    def typed(self, full: str | None = None) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, ggml type, ne) of each tensor in file order: a miniature's projections whose rows are a multiple
        of 256 (and that hold at least 2^16 values) tq1_0, its other matrices f16; at full size every matrix `full`;
        1-D tensors f32."""
        out = []
        for name, ne, kind in self.rows:
            count = 1
            for n in ne:
                count *= n
            if kind == "f32":
                out.append((name, "f32", ne))
            elif full is not None:
                out.append((name, full, ne))
            elif ne[0] % 256 == 0 and count >= 1 << 16:
                out.append((name, "tq1_0", ne))
            else:
                out.append((name, "f16", ne))
        return out

    def write(self, w, full: str | None = None) -> None:
        import gguf
        import numpy as np

        for name, type_name, ne in self.typed(full):
            if type_name == "f32":
                w.add_tensor(name, np.zeros(ne[::-1], dtype=np.float32))
            elif type_name == "f16":
                w.add_tensor(name, np.zeros(ne[::-1], dtype=np.float16))
            else:
                q = gguf.GGMLQuantizationType[type_name.upper()]
                block, size = gguf.GGML_QUANT_SIZES[q]
                byte_shape = (*ne[:0:-1], ne[0] // block * size)  # rows, then the bytes of one row
                w.add_tensor(name, np.zeros(byte_shape, dtype=np.uint8), raw_dtype=q)


def _blk(i: int, what: str, suffix: str = "weight") -> str:
    return f"blk.{i}.{what}" + (f".{suffix}" if suffix else "")


def _dims(c: dict[str, Any]) -> tuple[int, int, int, int, int]:
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
    return int(c["num_hidden_layers"]), heads, kv_heads, head_dim, head_dim


def _qkv(t: _Tensors, i: int, e: int, q: int, k: int, v: int, bias: bool = False) -> None:
    for name, width in (("attn_q", q), ("attn_k", k), ("attn_v", v)):
        t.add(_blk(i, name), (e, width))
        if bias:
            t.norm(_blk(i, name, "bias"), width)


def _dense_ffn(t: _Tensors, i: int, e: int, ff: int) -> None:
    t.norm(_blk(i, "ffn_norm"), e)
    t.add(_blk(i, "ffn_gate"), (e, ff))
    t.add(_blk(i, "ffn_up"), (e, ff))
    t.add(_blk(i, "ffn_down"), (ff, e))


def _experts(t: _Tensors, i: int, e: int, ff: int, n: int, norm: bool = True) -> None:
    if norm:  # qwen3next normalises its FFN input with post_attention_norm
        t.norm(_blk(i, "ffn_norm"), e)
    t.add(_blk(i, "ffn_gate_inp"), (e, n))
    t.add(_blk(i, "ffn_gate_exps"), (e, ff, n))
    t.add(_blk(i, "ffn_up_exps"), (e, ff, n))
    t.add(_blk(i, "ffn_down_exps"), (ff, e, n))


FULL_ARCHES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")  # the dense ones --full writes


def build(config: dict[str, Any], arch: str, full: bool = False, embd: int = SMALL, ffn: int = SMALL,
          vocab: int = SMALL) -> tuple[dict[str, Any], _Tensors]:
    """(the hyperparameters as (writer method, value) pairs in order, the tensors) of the miniature, with the
    embedding width, FFN and vocabulary given (all 256 unless asked), or of the full-size model (`full`)."""
    if arch not in ARCHES:
        raise ValueError(f"no miniature writer for llama.cpp architecture {arch!r} (have: {', '.join(ARCHES)})")
    c = text_config(config)
    if full:
        if arch not in FULL_ARCHES:
            raise ValueError(f"--full writes the dense architectures only ({', '.join(FULL_ARCHES)}), not {arch}")
        embd, ffn, vocab = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["vocab_size"])
    layers, heads, kv_heads, k_len, v_len = _dims(c)
    e = embd
    if arch in ("qwen2", "phi3") and not full:  # wq is {n_embd, n_embd}: the queries span the embedding
        e = heads * k_len
    hp: dict[str, Any] = {
        "add_context_length": int(c.get("max_position_embeddings") or DEFAULT_CONTEXT.get(arch, 4096)),
        "add_embedding_length": e,
        "add_block_count": layers,
        "add_feed_forward_length": ffn,
        "add_head_count": heads,
        "add_head_count_kv": kv_heads,
        "add_key_length": k_len,
        "add_value_length": v_len,
        "add_rope_dimension_count": k_len,
        "add_rope_freq_base": float(c.get("rope_theta") or 10000.0),
        "add_layer_norm_rms_eps": float(c.get("rms_norm_eps") or 1e-6),
        "add_vocab_size": vocab,
    }
    t = _Tensors()
    if full and arch == "llama" and (c.get("rope_scaling") or {}).get("rope_type") == "llama3":
        t.norm("rope_freqs.weight", k_len // 2)  # conversion/llama.py generate_extra_tensors: n_rot/2 f32 factors
    t.add("token_embd.weight", (e, vocab))
    t.norm("output_norm.weight", e)
    if arch == "deepseek2":
        return _deepseek2(c, hp, t, layers)
    if arch == "qwen3next":
        return _qwen3next(c, hp, t, layers, heads, kv_heads, k_len)
    if arch in ("gemma2", "gemma3"):
        hp["add_sliding_window"] = int(c["sliding_window"])
        if c.get("attn_logit_softcapping"):
            hp["add_attn_logit_softcapping"] = float(c["attn_logit_softcapping"])
        if c.get("final_logit_softcapping"):
            hp["add_final_logit_softcapping"] = float(c["final_logit_softcapping"])
        if arch == "gemma3" and c.get("rope_local_base_freq"):
            hp["add_rope_freq_base_swa"] = float(c["rope_local_base_freq"])
    if arch == "phi3":
        # conversion/phi.py: sliding_window written, 0 where the config has none
        hp["add_sliding_window"] = int(c.get("sliding_window") or 0)
    n_experts = 0
    if arch == "qwen3moe":
        n_experts = min(int(c["num_experts"]), MAX_EXPERTS)
        hp["add_expert_count"] = n_experts
        hp["add_expert_used_count"] = min(int(c["num_experts_per_tok"]), n_experts)
        hp["add_expert_feed_forward_length"] = SMALL
    q_width = e if arch in ("qwen2", "phi3") else heads * k_len
    for i in range(layers):
        t.norm(_blk(i, "attn_norm"), e)
        if arch == "phi3":  # its checkpoint's qkv_proj is fused, and the converter keeps it so
            t.add(_blk(i, "attn_qkv"), (e, q_width + kv_heads * k_len + kv_heads * v_len))
        else:  # the others' q_proj, k_proj and v_proj are written apart (the graph's node budget counts them)
            _qkv(t, i, e, q_width, kv_heads * k_len, kv_heads * v_len, bias=arch == "qwen2")
        t.add(_blk(i, "attn_output"), (q_width, e))
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            t.norm(_blk(i, "attn_q_norm"), k_len)
            t.norm(_blk(i, "attn_k_norm"), k_len)
        if arch in ("gemma2", "gemma3"):
            t.norm(_blk(i, "post_attention_norm"), e)
            t.norm(_blk(i, "post_ffw_norm"), e)
        if n_experts:
            _experts(t, i, e, SMALL, n_experts)
        elif arch == "phi3":  # ffn_up holds gate and up: {n_embd, 2 n_ff}
            t.norm(_blk(i, "ffn_norm"), e)
            t.add(_blk(i, "ffn_up"), (e, 2 * SMALL))
            t.add(_blk(i, "ffn_down"), (SMALL, e))
        else:
            _dense_ffn(t, i, e, ffn)
    if full and not c.get("tie_word_embeddings", True) and arch not in ("gemma2", "gemma3"):
        t.add("output.weight", (e, vocab))  # untied: the converter writes lm_head as output
    return hp, t


def _deepseek2(c: dict[str, Any], hp: dict[str, Any], t: _Tensors, layers: int):
    e = hp["add_embedding_length"]
    kv_lora, rope = int(c["kv_lora_rank"]), int(c["qk_rope_head_dim"])
    nope, v_head = int(c["qk_nope_head_dim"]), int(c["v_head_dim"])
    q_lora = c.get("q_lora_rank")
    heads = MLA_QUERY_HEADS
    n_experts = min(int(c["n_routed_experts"]), MAX_EXPERTS)
    dense = int(c.get("first_k_dense_replace") or 0)
    # conversion/deepseek.py, MLA: key_length = kv_lora_rank + rope, value_length = kv_lora_rank, one KV head
    hp.update({"add_head_count": heads, "add_head_count_kv": 1, "add_key_length": kv_lora + rope,
               "add_value_length": kv_lora, "add_key_length_mla": nope + rope, "add_value_length_mla": v_head,
               "add_kv_lora_rank": kv_lora, "add_rope_dimension_count": rope,
               "add_leading_dense_block_count": dense, "add_expert_count": n_experts,
               "add_expert_used_count": min(int(c["num_experts_per_tok"]), n_experts),
               "add_expert_shared_count": int(c.get("n_shared_experts") or 0),
               "add_expert_feed_forward_length": SMALL})
    if q_lora:
        hp["add_q_lora_rank"] = SMALL
    shared = int(c.get("n_shared_experts") or 0)
    for i in range(layers):
        t.norm(_blk(i, "attn_norm"), e)
        if q_lora:
            t.norm(_blk(i, "attn_q_a_norm"), SMALL)
            t.add(_blk(i, "attn_q_a"), (e, SMALL))
            t.add(_blk(i, "attn_q_b"), (SMALL, heads * (nope + rope)))
        else:
            t.add(_blk(i, "attn_q"), (e, heads * (nope + rope)))
        t.norm(_blk(i, "attn_kv_a_norm"), kv_lora)
        t.add(_blk(i, "attn_kv_a_mqa"), (e, kv_lora + rope))
        t.add(_blk(i, "attn_k_b"), (nope, kv_lora, heads))
        t.add(_blk(i, "attn_v_b"), (kv_lora, v_head, heads))
        t.add(_blk(i, "attn_output"), (heads * v_head, e))
        if i < dense:
            _dense_ffn(t, i, e, SMALL)
            continue
        _experts(t, i, e, SMALL, n_experts)
        t.add(_blk(i, "ffn_gate_shexp"), (e, SMALL * shared))
        t.add(_blk(i, "ffn_up_shexp"), (e, SMALL * shared))
        t.add(_blk(i, "ffn_down_shexp"), (SMALL * shared, e))
    return hp, t


def _qwen3next(c: dict[str, Any], hp: dict[str, Any], t: _Tensors, layers: int, heads: int, kv_heads: int,
               k_len: int):
    e = hp["add_embedding_length"]
    d_state, n_group = int(c["linear_key_head_dim"]), int(c["linear_num_key_heads"])
    n_v_heads, v_dim = int(c["linear_num_value_heads"]), int(c["linear_value_head_dim"])
    conv = int(c["linear_conv_kernel_dim"])
    interval = int(c.get("full_attention_interval") or 4)
    n_experts = min(int(c["num_experts"]), MAX_EXPERTS)
    rotary = float(c.get("partial_rotary_factor") or 0.25)
    # conversion/qwen.py (Qwen3NextModel)
    hp.update({"add_ssm_conv_kernel": conv, "add_ssm_state_size": d_state, "add_ssm_group_count": n_group,
               "add_ssm_time_step_rank": n_v_heads, "add_ssm_inner_size": v_dim * n_v_heads,
               "add_full_attention_interval": interval, "add_rope_dimension_count": int(k_len * rotary),
               "add_expert_count": n_experts,
               "add_expert_used_count": min(int(c["num_experts_per_tok"]), n_experts),
               "add_expert_feed_forward_length": SMALL, "add_expert_shared_feed_forward_length": SMALL})
    key_dim, value_dim = d_state * n_group, d_state * n_v_heads
    for i in range(layers):
        t.norm(_blk(i, "attn_norm"), e)
        t.norm(_blk(i, "post_attention_norm"), e)
        if (i + 1) % interval == 0:  # full attention (src/models/qwen3next.cpp: is_recr unless (i+1) % interval == 0)
            _qkv(t, i, e, k_len * heads * 2, kv_heads * k_len, kv_heads * k_len)  # queries carry their gate
            t.add(_blk(i, "attn_output"), (k_len * heads, e))
            t.norm(_blk(i, "attn_q_norm"), k_len)
            t.norm(_blk(i, "attn_k_norm"), k_len)
        else:
            t.add(_blk(i, "ssm_in"), (e, key_dim * 2 + value_dim * 2))
            t.add(_blk(i, "ssm_conv1d"), (conv, key_dim * 2 + value_dim), "f32")
            t.norm(_blk(i, "ssm_dt", "bias"), n_v_heads)
            t.norm(_blk(i, "ssm_a", ""), n_v_heads)
            t.add(_blk(i, "ssm_ba"), (e, n_v_heads * 2))
            t.norm(_blk(i, "ssm_norm"), d_state)
            t.add(_blk(i, "ssm_out"), (value_dim, e))
        _experts(t, i, e, SMALL, n_experts, norm=False)
        t.norm(_blk(i, "ffn_gate_inp_shexp"), e)
        t.add(_blk(i, "ffn_gate_shexp"), (e, SMALL))
        t.add(_blk(i, "ffn_up_shexp"), (e, SMALL))
        t.add(_blk(i, "ffn_down_shexp"), (SMALL, e))
    return hp, t


def write(config: dict[str, Any], arch: str, out: Path, full: str | None = None, embd: int = SMALL,
          ffn: int = SMALL, vocab: int = SMALL) -> Path:
    import gguf

    hp, tensors = build(config, arch, full is not None, embd, ffn, vocab)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"kvsize miniature ({arch})")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for method, value in hp.items():
        getattr(w, method)(value)
    w.add_tokenizer_model("none")  # src/llama-vocab.cpp: "none" adds vocab_size dummy tokens
    tensors.write(w, full)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write a KV-faithful miniature GGUF from a config.json")
    ap.add_argument("config", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", required=True, choices=ARCHES)
    ap.add_argument("--full", default=None, help="write the full-size model, every matrix in this ggml type")
    for dim in ("embd", "ffn", "vocab"):
        ap.add_argument(f"--{dim}", type=int, default=SMALL, help=f"a miniature's {dim} (default {SMALL})")
    args = ap.parse_args(argv)
    write(json.loads(args.config.read_text()), args.arch, args.out, args.full, args.embd, args.ffn, args.vocab)
    print(f"{args.out}: {args.out.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
