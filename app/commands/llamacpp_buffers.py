"""llama.cpp's buffers beside the KV cache in the outputs of estimate and compare (sizing/engines/llamacpp_quant.py)."""

from __future__ import annotations


def serve_buffers_of(scenario, k_format: str, v_format: str):
    """The buffers llama.cpp makes for the scenario's serve command; None for another engine, or where the estimate's
    notes say why llama.cpp's own buffers are not sized."""
    from sizing.engines import get_engine

    engine = get_engine(scenario.engine)
    if engine.name != "llamacpp":
        return None
    from sizing.engines.llamacpp_quant import scenario_buffers

    return scenario_buffers(scenario, engine, k_format, v_format)[0]


def flat_columns(record: dict | None) -> dict:
    """The buffers as CSV columns (llamacpp_*), the CPU load's buffers as NAME=bytes."""
    if not record:
        return {}
    out = {f"llamacpp_{k}": v for k, v in record.items() if not isinstance(v, dict)}
    out["llamacpp_cpu_load_model_buffers_bytes"] = " ".join(
        f"{k}={v}" for k, v in record["cpu_load_model_buffers_bytes"].items())
    return out


def table_lines(buffers) -> list[str]:
    from sizing.engines.llamacpp_quant import buffer_lines

    return ["  llama.cpp buffers beside the KV cache (MiB = 2^20 bytes):", *(f"    {line}" for line in buffer_lines(buffers))]


def check_sweep_weights(weights_dtype: str) -> None:
    """A sweep's speed columns read kvsize's weight formats: a GGUF type is refused there in one line."""
    from sizing.engines.llamacpp_quant import is_gguf_type
    from sizing.engines.memory import WEIGHT_ALIASES, WEIGHT_FORMATS

    if is_gguf_type(weights_dtype) and str(weights_dtype).strip().lower() not in {*WEIGHT_FORMATS, *WEIGHT_ALIASES}:
        from sizing.errors import KvsizeError

        raise KvsizeError(f"--weights-dtype {weights_dtype}: a sweep takes kvsize's weight formats (auto, bf16, fp16, "
                          "fp32, fp8, int8, int4, ...; llama.cpp rows size auto as the bf16/f16 GGUF); size a GGUF "
                          "type with kvsize estimate or compare --engine llamacpp")
