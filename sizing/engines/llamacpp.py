"""llama.cpp's rules: no paging (contiguous per-layer K and V tensors of n_ctx cells, n_ctx padded), and no
memory rule of its own: the headroom the user leaves.

`predict_load` is what llama.cpp allocates when it makes a context (llama_init_from_model): every cache it
creates, with its cells, layers, streams and the bytes of K and V, each recurrent memory, or the line it
refuses the settings with. Every rule names the llama.cpp source it follows.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from functools import lru_cache

from ..cache.layers import CacheLayout
from ..config import ModelShape
from ..errors import KvsizeError
from ..profiles import PROFILES_DIR
from .base import Engine, ExactPool, Pool, headroom_budget, refuse_compressed

LLAMACPP_CTX_PAD = 256  # llama.cpp pads n_ctx (and each sequence's n_ctx_seq) to 256 (src/llama-context.cpp)
LLAMACPP_SWA_PAD = 256  # the SWA cache is always padded to 256 (src/llama-kv-cache-iswa.cpp)
MIB = 1 << 20  # llama.cpp prints its buffers in MiB (1024.0f * 1024.0f)
LLAMA_MAX_SEQ = 256  # src/llama-cparams.h: a context refuses more sequences ("n_seq_max must be <= 256")

# ggml/src/ggml.c type_traits: (values per block, bytes per block) of each type llama.cpp accepts for the
# cache (common/arg.cpp kv_cache_types, in that order)
GGML_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
    "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24),
}
QUANTIZED = frozenset(t for t, (block, _) in GGML_TYPES.items() if block > 1)  # ggml_is_quantized
# kvsize's format names for llama.cpp's cache types (sizing/cache/formats.py)
KVSIZE_FORMAT = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
                 "iq4_nl": "iq4_nl", "q5_0": "q5_0", "q5_1": "q5_1"}
RECURRENT_TYPE = "f32"  # src/llama-model.cpp create_memory: recurrent_type_r and _s are GGML_TYPE_F32

# config.json model_type -> the llama.cpp architecture its GGUF is converted to (conversion/__init__.py)
ARCHITECTURES = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "gemma2": "gemma2", "gemma3": "gemma3",
    "gemma3_text": "gemma3", "phi3": "phi3", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
    "qwen3_next": "qwen3next",
}
# Architectures whose loader reads a sliding window and the layer pattern it applies to (src/models/gemma2.cpp:
# load_swa_pattern(ml, 2); gemma3.cpp: 6, the config's pattern being the same). The others build every layer with
# the full context whatever the config's sliding_window says: llama (MistralForCausalLM converts to it), qwen2,
# qwen3, and phi3, whose loader reads the window and turns it off ("Phi SWA is currently disabled").
SWA_ARCHITECTURES = frozenset({"gemma2", "gemma3"})


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to  # GGML_PAD


def row_bytes(type_name: str, values: int) -> int:
    """ggml_row_size: the bytes of `values` values of a type, whole blocks only."""
    block, size = GGML_TYPES[type_name]
    return values // block * size


def mib_text(nbytes: int) -> str:
    """A byte count as llama.cpp prints it: (float) bytes / (1024.0f * 1024.0f), then %.2f."""
    as_float = struct.unpack("f", struct.pack("f", float(nbytes)))[0]
    return f"{as_float / MIB:.2f}"


def llamacpp_type(name: str, option: str = "--cache-type-k") -> str:
    key = str(name).strip().lower()
    key = {fmt: t for t, fmt in KVSIZE_FORMAT.items()}.get(key, key)
    if key not in GGML_TYPES:
        raise KvsizeError(f"{option} {name}: llama.cpp refuses this cache type (it accepts: {', '.join(GGML_TYPES)})")
    return key


CONVERTS_FILE = PROFILES_DIR / "llamacpp_converts.json"  # the Hugging Face architectures llama.cpp converts


@lru_cache(maxsize=1)
def _converted() -> frozenset[str]:
    return frozenset(json.loads(CONVERTS_FILE.read_text(encoding="utf-8"))["architectures"])


def llamacpp_architecture(shape: ModelShape) -> str:
    """The llama.cpp architecture a config converts to, or one line naming why llama.cpp or kvsize cannot load it."""
    hf = shape.architectures[0] if shape.architectures else None
    if hf is not None and hf not in _converted():
        raise KvsizeError(f"llama.cpp has no architecture for {hf}: its converter (convert_hf_to_gguf.py) takes no "
                          f"{hf} model, so there is no GGUF to load (profiles/llamacpp_converts.json)")
    arch = ARCHITECTURES.get(shape.model_type)
    if arch is None:
        raise KvsizeError(f"kvsize does not size llama.cpp's cache for model_type {shape.model_type!r} (it sizes: "
                          f"{', '.join(sorted(ARCHITECTURES))})")
    return arch


@dataclass(frozen=True)
class LlamaCppCache:
    """One llama_kv_cache: K and V tensors of [row, cells, streams] for each of its layers."""

    role: str  # "kv" (the only cache), "non-SWA" or "SWA" (llama_kv_cache_iswa)
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str
    k_bytes: int
    type_v: str
    v_bytes: int

    @property
    def size_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass(frozen=True)
class LlamaCppRecurrent:
    """llama_memory_recurrent: an R (conv) and an S (state) row per cell for each recurrent layer."""

    cells: int
    layers: int  # as llama.cpp prints it: the model's layers, recurrent or not
    seqs: int
    r_bytes: int
    s_bytes: int

    @property
    def size_bytes(self) -> int:
        return self.r_bytes + self.s_bytes


@dataclass(frozen=True)
class LlamaCppLoad:
    n_ctx: int  # after padding
    n_ctx_seq: int
    caches: tuple[LlamaCppCache, ...] = ()
    recurrent: tuple[LlamaCppRecurrent, ...] = ()
    refusal: str | None = None  # the line llama_init_from_model refuses the context with

    @property
    def kv_bytes(self) -> int:
        return sum(c.size_bytes for c in self.caches)


@dataclass(frozen=True)
class _Layer:
    k_row: int  # values of one cell's K row (n_embd_k_gqa)
    v_row: int  # of its V row (0: no V, MLA)
    sliding: bool
    head_k: int  # n_embd_head_k, n_embd_head_v: what a quantized type's block must divide with flash attention
    head_v: int


def _layers(shape: ModelShape, arch: str) -> tuple[list[_Layer], list[int]]:
    """(each layer holding KV, the recurrent layers)."""
    kv, recurrent = [], []
    for i, kind in enumerate(shape.layer_kinds):
        if kind == "recurrent":
            recurrent.append(i)
        elif kind in ("none", "shared"):
            continue
        elif shape.is_mla:
            # src/llama-kv-cache.cpp: under MLA only K is stored, one head of n_embd_head_k = kv_lora_rank + rope
            # (conversion/deepseek.py: key_length); its value_length, kv_lora_rank, divides by a block where the
            # latent does (both multiples of 64 in every MLA config), so the latent stands for it in the check
            latent = shape.mla_latent_dim
            kv.append(_Layer(latent, 0, False, latent, latent))
        else:
            heads = shape.kv_heads_of(i)
            k, v = shape.head_dim_of(i), shape.v_head_dim_of(i)
            kv.append(_Layer(heads * k, heads * v, kind == "sliding" and arch in SWA_ARCHITECTURES, k, v))
    return kv, recurrent


def _refusal(shape: ModelShape, kv: list[_Layer], type_k: str, type_v: str, flash_attn: bool) -> str | None:
    """llama_init_from_model's checks, in its order (src/llama-context.cpp)."""
    if shape.is_mla and type_k != type_v:
        return f"model does not support different K ({type_k}) and V ({type_v}) cache types"
    if type_v in QUANTIZED and not flash_attn:
        return "quantized V cache requires flash_attn to be enabled"
    for side, t in (("K", type_k), ("V", type_v)):
        block = GGML_TYPES[t][0]
        if not flash_attn or t not in QUANTIZED:
            continue
        for layer in kv:
            head = layer.head_k if side == "K" else layer.head_v
            if head % block:
                return (f"{side} cache type {t} with block size {block} does not divide "
                        f"n_embd_head_{side.lower()}={head}")
    return None


def predict_load(shape: ModelShape, n_ctx: int, n_seq_max: int = 1, type_k: str = "f16", type_v: str = "f16",
                 flash_attn: bool = True, kv_unified: bool = False, n_batch: int = 2048, n_ubatch: int = 512,
                 swa_full: bool = False, n_rs_seq: int = 0) -> LlamaCppLoad:
    """What llama.cpp allocates for a context of these parameters (llama_context_params), cache by cache."""
    arch = llamacpp_architecture(shape)
    type_k, type_v = llamacpp_type(type_k, "--cache-type-k"), llamacpp_type(type_v, "--cache-type-v")
    if n_ctx < 1 or n_seq_max < 1:
        raise KvsizeError(f"n_ctx and n_seq_max must be at least 1, got {n_ctx} and {n_seq_max}")
    if n_seq_max > LLAMA_MAX_SEQ:
        raise KvsizeError(f"llama.cpp refuses n_seq_max {n_seq_max} (-np): n_seq_max must be <= {LLAMA_MAX_SEQ} "
                          "(src/llama-cparams.h LLAMA_MAX_SEQ)")
    # src/llama-context.cpp: the batch is bounded by the context asked for, before it is padded
    n_batch = min(n_ctx, n_batch)
    n_ubatch = min(n_batch, n_ubatch)
    padded = _pad(n_ctx, LLAMACPP_CTX_PAD)
    if kv_unified:
        n_ctx_seq = padded
    else:  # each sequence's share, padded again, and n_ctx made its multiple
        n_ctx_seq = _pad(padded // n_seq_max, LLAMACPP_CTX_PAD)
        padded = n_ctx_seq * n_seq_max
    streams = 1 if kv_unified else n_seq_max
    kv, recurrent = _layers(shape, arch)
    refusal = _refusal(shape, kv, type_k, type_v, flash_attn)
    if refusal:
        return LlamaCppLoad(padded, n_ctx_seq, refusal=refusal)
    # [TAG_V_CACHE_VARIABLE] src/llama-kv-cache.cpp: without flash attention V is stored transposed, every
    # layer's rows as wide as the widest
    v_max = max((layer.v_row for layer in kv), default=0)

    def cache(role: str, cells: int, rows: list[_Layer]) -> LlamaCppCache:
        k_bytes = sum(row_bytes(type_k, r.k_row) for r in rows) * cells * streams
        v_bytes = sum(row_bytes(type_v, r.v_row if flash_attn else v_max) for r in rows if r.v_row) * cells * streams
        return LlamaCppCache(role, cells, len(rows), n_seq_max, streams, type_k, k_bytes, type_v, v_bytes)

    caches: tuple[LlamaCppCache, ...] = ()
    if any(layer.sliding for layer in kv):
        # src/llama-kv-cache-iswa.cpp: the SWA cache holds n_swa per stream (n_swa * n_seq_max unified) plus a
        # ubatch, padded to 256, never more than the full cache
        swa_cells = _pad(min(n_ctx_seq, shape.sliding_window * (n_seq_max if kv_unified else 1) + n_ubatch),
                         LLAMACPP_SWA_PAD)
        if swa_full:
            swa_cells = n_ctx_seq
        caches = (cache("non-SWA", n_ctx_seq, [r for r in kv if not r.sliding]),
                  cache("SWA", swa_cells, [r for r in kv if r.sliding]))
    elif kv:
        caches = (cache("kv", n_ctx_seq, kv),)
    states: tuple[LlamaCppRecurrent, ...] = ()
    if recurrent:
        # src/llama-memory-recurrent.cpp: max(1, n_seq_max) cells, each (1 + n_rs_seq) rows of n_embd_r (conv)
        # and n_embd_s (state) values per recurrent layer (src/llama-hparams.cpp n_embd_r, n_embd_s)
        cells = max(1, n_seq_max)
        conv = shape.recurrent_conv_elements
        state = shape.recurrent_state_elements - conv
        rows = cells * (1 + n_rs_seq) * len(recurrent)
        # its size line counts every layer of the model (the n_layer it loops over, skipping the attention
        # layers), while only the recurrent layers hold rows
        states = (LlamaCppRecurrent(cells, shape.num_layers, n_seq_max, row_bytes(RECURRENT_TYPE, conv) * rows,
                                    row_bytes(RECURRENT_TYPE, state) * rows),)
    return LlamaCppLoad(padded, n_ctx_seq, caches, states)


def log_lines(load: LlamaCppLoad) -> tuple[str, ...]:
    """The memory lines llama.cpp prints for this context, in its words (the format strings of
    src/llama-kv-cache.cpp, llama-kv-cache-iswa.cpp and llama-memory-recurrent.cpp)."""
    if load.refusal:
        return (f"llama_init_from_model: {load.refusal}",)
    lines = []
    for c in load.caches:
        if c.role != "kv":
            lines.append(f"llama_kv_cache_iswa: creating {c.role:>7} KV cache, size = {c.cells} cells")
        lines.append(f"llama_kv_cache: size = {mib_text(c.size_bytes):>7} MiB ({c.cells:6d} cells, {c.layers:3d} "
                     f"layers, {c.seqs:2d}/{c.streams} seqs), K ({c.type_k}): {mib_text(c.k_bytes):>7} MiB, "
                     f"V ({c.type_v}): {mib_text(c.v_bytes):>7} MiB")
    for r in load.recurrent:
        lines.append(f"llama_memory_recurrent: size = {mib_text(r.size_bytes):>7} MiB ({r.cells:6d} cells, "
                     f"{r.layers:3d} layers, {r.seqs:2d} seqs  0 rs_seq), R ({RECURRENT_TYPE}): "
                     f"{mib_text(r.r_bytes):>7} MiB, S ({RECURRENT_TYPE}): {mib_text(r.s_bytes):>7} MiB, "
                     f"P ({RECURRENT_TYPE}): {mib_text(0):>7} MiB")
    return tuple(lines)


def serve_log_lines(shape: ModelShape, max_model_len: int, concurrency: int, k_format: str,
                    v_format: str) -> tuple[str, ...]:
    """What llama-server prints for kvsize's serve command (sizing/engines/serve.py: -c max_model_len x
    concurrency, -np concurrency, -kvu, -fa on), or nothing where kvsize does not size the architecture."""
    if shape.model_type not in ARCHITECTURES or concurrency > LLAMA_MAX_SEQ:
        return ()
    try:
        load = predict_load(shape, max_model_len * concurrency, concurrency, k_format, v_format, True, True)
    except KvsizeError:
        return ()
    return log_lines(load)


def _llamacpp_model(shape: ModelShape, k_format: str, v_format: str, release):
    """The model as llama.cpp builds it where that departs from the config: no GGUF for an architecture its
    converter does not take; every layer full where the architecture's loader reads no window; recurrent state
    in f32."""
    hf = shape.architectures[0] if shape.architectures else None
    if hf is not None and hf not in _converted():
        llamacpp_architecture(shape)  # raises: llama.cpp has no architecture for it
    arch = ARCHITECTURES.get(shape.model_type)
    types = [{fmt: t for t, fmt in KVSIZE_FORMAT.items()}.get(f) for f in (k_format, v_format)]
    if arch is not None and None not in types:
        # the serve command turns flash attention on (-fa on): what llama_init_from_model still refuses
        refusal = _refusal(shape, _layers(shape, arch)[0], types[0], types[1], True)
        if refusal:
            raise KvsizeError(f"llama.cpp refuses -ctk {types[0]} -ctv {types[1]} for this model: {refusal}")
    if arch is not None and arch not in SWA_ARCHITECTURES and "sliding" in shape.layer_kinds:
        shape = replace(shape, layer_kinds=tuple("full" if k == "sliding" else k for k in shape.layer_kinds))
    if "recurrent" in shape.layer_kinds:
        # the conv and the SSM state both f32 (RECURRENT_TYPE): counted as one f32 state, the bytes are the same
        shape = replace(shape, recurrent_state_dtype="fp32", recurrent_conv_elements=0)
    return shape, k_format, v_format, ()


def _llamacpp_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    refuse_compressed(layout, "llama.cpp")
    return ExactPool.build(layout, LLAMACPP_CTX_PAD)


LLAMACPP = Engine("llamacpp", None, 0.0, None, 1, False, headroom_budget, _llamacpp_pool,
                  "src/llama-kv-cache.cpp (contiguous per-layer K and V tensors of n_ctx cells; "
                  "n_ctx padded to 256)", model_rule=_llamacpp_model, activation_reads_context=True)
