"""Quantized checkpoints: quantization_config's quant_method, read through a table of schemes
(compressed-tensors, ModelOpt, GPTQ/AWQ/AutoRound, bitsandbytes), as one of kvsize's weight formats, with
the modules a checkpoint leaves in the model dtype."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import KvsizeError
from .fields import brief
from .reading import Reading
from .shape import MODEL_DTYPE

# every config field this module's readers look up
FIELDS = ("quantization_config",)


def read_quantization(r: Reading) -> None:
    f, notes, num_layers = r.f, r.notes, r.num_layers
    quant = f.get("quantization_config")
    if quant is not None and not isinstance(quant, dict) and not hasattr(quant, "to_dict"):
        raise KvsizeError(f"config.json field 'quantization_config' is {type(quant).__name__} "
                          f"{str(quant)[:40]!r}; it must be an object such as {{\"quant_method\": \"fp8\"}}")
    if quant is not None and not isinstance(quant, dict):
        quant = quant.to_dict()
    quant_method = quant.get("quant_method") if isinstance(quant, dict) else None
    scheme = QUANTIZATION_SCHEMES.get(str(quant_method))
    if scheme is None and quant_method is None and isinstance(quant, dict):
        if "quant_algo" in quant:
            scheme = QUANTIZATION_SCHEMES["modelopt"]  # ModelOpt's exports that name only their quant_algo
        elif "load_in_4bit" in quant or "load_in_8bit" in quant:
            # transformers' BitsAndBytesConfig saved without its method
            scheme = QUANTIZATION_SCHEMES["bitsandbytes"]
    ct_format, ct_attention, ct_mlp_unquantized = scheme.read(quant, num_layers) if scheme else (None, None, False)
    if isinstance(quant, dict) and quant and quant_method is None and ct_format is None and not _kv_only(quant):
        notes.append("config.json quantization_config names no quant_method kvsize reads; the weights are sized in "
                     "the model dtype: give the checkpoint's format with --weights-dtype (e.g. int4_g128_sym)")
    if quant_method is not None and str(quant_method) not in FORMAT_BY_METHOD and ct_format is None \
            and not _kv_only(quant):
        if scheme is not None:
            given = ", ".join(f"{k} {brief(quant[k])}" for k in scheme.fields if k in quant) or "none of its settings"
            what = f"quant_method {str(quant_method)!r} with {given} (kvsize reads {scheme.accepts})"
        else:
            what = (f"quant_method {brief(quant_method)} is not a scheme kvsize reads "
                    f"({', '.join(sorted([*QUANTIZATION_SCHEMES, *FORMAT_BY_METHOD]))})")
        notes.append(f"config.json quantization_config: {what}; the weights are sized in the model dtype: give "
                     "the checkpoint's format with --weights-dtype (e.g. int4_g128_sym)")
    r.quant_method, r.weights_format, r.attention_format, r.mlp_unquantized = \
        quant_method, ct_format, ct_attention, ct_mlp_unquantized


def _kv_only(quant: dict) -> bool:
    """A quantization_config that quantizes only the KV cache (compressed-tensors with a kv_cache_scheme and no
    config_groups, ModelOpt with a kv_cache_quant_algo and no quant_algo): the weights are the model dtype's."""
    return (bool(quant.get("kv_cache_scheme")) and not quant.get("config_groups")) or \
        (bool(quant.get("kv_cache_quant_algo")) and quant.get("quant_algo") in (None, "null", "NONE"))


# a checkpoint scheme: (weight format, attention's format where it differs, dense MLPs and shared experts
# left unquantized)
Scheme = tuple[str | None, str | None, bool]


def _compressed_tensors_scheme(quant: dict, num_layers: int) -> Scheme:
    """A compressed-tensors quantization_config as a Scheme: the Linear group's weights (float 8-bit per channel or per
    128x128 block: fp8; float 4-bit in groups of 16: nvfp4; int 8-bit: int8; int 4-bit: int4 in its groups,
    symmetric or not; other schemes: None, sized by --weights-dtype), and what its `ignore` list keeps out
    for every language-model layer (RedHatAI's FP8-dynamic Llama 4: attention; Kimi-K2.5: attention, shared
    experts and dense MLPs, by pattern)."""
    groups = quant.get("config_groups")
    if not isinstance(groups, dict):
        return None, None, False
    weights = None
    for group in groups.values():
        targets = group.get("targets") if isinstance(group, dict) else None
        if isinstance(targets, list) and "Linear" in targets and isinstance(group.get("weights"), dict):
            weights = group["weights"]
            break
    if weights is None:
        return None, None, False
    bits, kind, strategy, size = (weights.get("num_bits"), weights.get("type"), weights.get("strategy"),
                                  weights.get("group_size"))
    fmt = None
    if kind == "float" and bits == 8:
        fmt = "fp8" if strategy == "block" else "fp8_channel"
    elif kind == "float" and bits == 4 and size == 16:
        fmt = "nvfp4"
    elif kind == "int" and bits == 8:
        fmt = "int8"
    elif kind == "int" and bits == 4 and isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 4096:
        fmt = "int4" if size == 128 and not weights.get("symmetric") else f"int4_g{size}" + (
            "_sym" if weights.get("symmetric") else "")
    return (fmt, *_unquantized_modules(quant.get("ignore"), num_layers))


def _gptq_awq_scheme(quant: dict, num_layers: int) -> Scheme:
    """GPTQ and AWQ checkpoints (and AutoRound's GPTQ-style exports): `bits` (AWQ's older `w_bit`) integers
    per weight in groups of `group_size` (-1: one group per output channel), an fp16 scale per group, and a
    zero point of as many bits unless symmetric (GPTQ's `sym`, AWQ without `zero_point`), as stored (what the
    engine's kernels keep of the zeros is its release's rule: sizing/engines/memory.py engine_weight_format). The modules AWQ's
    `modules_to_not_convert` (or bitsandbytes-style `llm_int8_skip_modules`) names stay in the model dtype."""
    bits = quant.get("bits", quant.get("w_bit"))
    size = quant.get("group_size", quant.get("q_group_size", 128))
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in (2, 3, 4, 8):
        return None, None, False
    if not isinstance(size, int) or isinstance(size, bool) or not (size == -1 or 0 < size <= 99999):
        return None, None, False
    symmetric = quant.get("sym", True) if "zero_point" not in quant else quant.get("zero_point") is False
    if not isinstance(symmetric, bool) or not isinstance(quant.get("zero_point", True), bool):
        return None, None, False
    if quant.get("data_type", "int") != "int":  # AutoRound's float and mx schemes are not these integers
        return None, None, False
    fmt = f"int{bits}_g{'channel' if size == -1 else size}" + ("_sym" if symmetric else "")
    listed = _listed_modules(quant.get("modules_in_block_to_quantize"))
    if listed is not None:
        return fmt, *listed
    return (fmt, *_unquantized_modules(quant.get("modules_to_not_convert"), num_layers))


def _listed_modules(listed: Any) -> tuple[str | None, bool] | None:
    """GPTQ's modules_in_block_to_quantize (a list, or GPTQModel's list of lists, of module names in a layer):
    what it leaves out stays in the model dtype in vLLM (auto_gptq.py get_linear_quant_method); routed
    experts are quantized whatever it says. None where the config gives no list."""
    if not isinstance(listed, list) or not listed:
        return None
    names = [n for x in listed for n in (x if isinstance(x, list) else [x]) if isinstance(n, str)]
    attention = any(re.search(r"attn|attention", n) for n in names)
    mlp = any(_names_dense_mlp(n) for n in names)
    return (None if attention else MODEL_DTYPE), not mlp


def _bitsandbytes_scheme(quant: dict, num_layers: int) -> Scheme:
    """bitsandbytes checkpoints: 4-bit (NF4 or FP4) with an fp32 absmax per 64 weights, double-quantized ones
    too (vLLM's loader turns the nested 8-bit absmax back into fp32 as it loads: BitsAndBytesModelLoader
    _dequantize_dq); or LLM.int8 (int8 with an fp32 scale per row). `llm_int8_skip_modules` stays in the
    model dtype."""
    if quant.get("load_in_4bit") is True:
        fmt = "bnb4"
    elif quant.get("load_in_8bit") is True:
        fmt = "bnb8"
    else:
        return None, None, False
    return (fmt, *_unquantized_modules(quant.get("llm_int8_skip_modules"), num_layers))


_MODELOPT_FORMATS = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "FP8": "fp8_tensor"}


def _modelopt_scheme(quant: dict, num_layers: int) -> Scheme:
    """A ModelOpt quantization_config (NVIDIA's checkpoints) as a Scheme: NVFP4 or per-tensor FP8 weights,
    with the modules its `ignore` (or `exclude_modules`) list keeps in the model dtype."""
    algo = str(quant.get("quant_algo")).upper()
    if algo == "MIXED_PRECISION":
        return _modelopt_mixed(quant)
    return (_MODELOPT_FORMATS.get(algo), *_unquantized_modules(quant.get("ignore", quant.get("exclude_modules")),
                                                               num_layers))


def _modelopt_mixed(quant: dict) -> Scheme:
    """ModelOpt MIXED_PRECISION: `quantized_layers` names each module's scheme; the MLP and experts' format and
    the attention's, the most common scheme of each kind (Qwen3.6-35B-A3B-NVFP4: experts and shared experts
    NVFP4, attention FP8); attention no module names takes the MLP's format."""
    layers = quant.get("quantized_layers")
    if not isinstance(layers, dict):
        return None, None, False
    kinds: dict[str, list[str]] = {"mlp": [], "attention": []}
    for name, scheme in layers.items():
        fmt = _MODELOPT_FORMATS.get(str(scheme.get("quant_algo")).upper()) if isinstance(scheme, dict) else None
        if fmt is None or not isinstance(name, str) or "vision" in name:
            continue
        kinds["attention" if "attn" in name else "mlp"].append(fmt)
    common = {k: max(set(v), key=v.count) if v else None for k, v in kinds.items()}
    return common["mlp"], common["attention"], False


@dataclass(frozen=True)
class QuantizationScheme:
    """How kvsize reads one quant_method: the reader of its settings, and (for saying which setting it could
    not read) the fields the reader takes and what it accepts."""

    read: Callable[[dict, int], Scheme]
    fields: tuple[str, ...]
    accepts: str


_INTEGER = QuantizationScheme(_gptq_awq_scheme, ("bits", "w_bit", "group_size", "q_group_size", "sym", "zero_point",
                                                 "data_type"),
                              "bits 2, 3, 4 or 8; group_size -1 or 1-99999; sym and zero_point true or false; "
                              "data_type int")
_AUTO_ROUND_METHODS = ("auto-round", "intel/auto-round", "auto_round")
QUANTIZATION_SCHEMES = {
    "compressed-tensors": QuantizationScheme(
        _compressed_tensors_scheme, ("config_groups",),
        "a config_groups entry targeting Linear with float 8-bit, float 4-bit in groups of 16, int 8-bit or int "
        "4-bit weights"),
    "modelopt": QuantizationScheme(_modelopt_scheme, ("quant_algo",),
                                   "quant_algo NVFP4, W4A16_NVFP4, FP8 or MIXED_PRECISION"),
    "gptq": _INTEGER, "awq": _INTEGER, **dict.fromkeys(_AUTO_ROUND_METHODS, _INTEGER),
    "bitsandbytes": QuantizationScheme(_bitsandbytes_scheme, ("load_in_4bit", "load_in_8bit"),
                                       "load_in_4bit or load_in_8bit true"),
}
# quant_methods whose name alone gives the weight format
FORMAT_BY_METHOD = {"fp8": "fp8", "mxfp4": "mxfp4"}
# checkpoints packed as GPTQ packs them (qweight, qzeros, scales), AutoRound's exports among them: they store
# zero points even when symmetric
GPTQ_PACKED_METHODS = ("gptq", *_AUTO_ROUND_METHODS)


def _unquantized_modules(ignore: Any, num_layers: int) -> tuple[str | None, bool]:
    """Whether a quantized checkpoint's ignore list keeps every language-model layer's attention (then its
    format is MODEL_DTYPE), and its dense MLPs and shared experts, in the model dtype: by pattern
    (`re:.*self_attn.*`, `*self_attn*`) or named for every layer (`model.layers.7.self_attn*`)."""
    names = [x for x in ignore if isinstance(x, str) and not re.search(_TOWER_NAMES, x)] \
        if isinstance(ignore, list) else []
    patterns = [x for x in names if x.startswith("re:") or not re.search(r"layers\.\d+", x)]
    # named layer by layer: every layer's attention (or linear-attention mixer) or MLP named
    attention_layers = {m.group(1) for x in names if (m := re.search(r"layers\.(\d+)\.\w*attn", x))}
    mlp_layers = {m.group(1) for x in names if (m := re.search(r"layers\.(\d+)\.", x)) and _names_dense_mlp(x)}
    attention = any("self_attn" in x for x in patterns) or len(attention_layers) >= num_layers
    mlp = any(_names_dense_mlp(x) for x in patterns) or len(mlp_layers) >= num_layers
    return MODEL_DTYPE if attention else None, mlp


# a multimodal model's towers and projectors, whose modules an ignore list names beside the language model's
_TOWER_NAMES = r"vision|visual|merger|mm_projector|multi_modal_projector|audio"


def _names_dense_mlp(entry: str) -> bool:
    """Whether a module name or pattern names dense MLPs or shared experts (`mlp`, `*mlp*`, `mlp.down_proj`,
    `re:.*shared_experts.*`), not an MoE router (`mlp.gate`, `re:.*mlp.gate$`, `shared_expert_gate`, `router`),
    which the scheme keeps in the model dtype beside quantized MLPs."""
    if re.search(r"(gate|router)[\\$)*]*$", entry) or re.search(r"(gate|router)\.weight$", entry):
        return False
    if re.search(r"shared_experts?\b", entry):
        return True
    if re.search(r"(^|[^_a-z])experts\b", entry):  # the routed experts, not a dense MLP
        return False
    return bool(re.search(r"(^|[^a-z])(mlp|feed_forward)($|[^a-z_])", entry))
