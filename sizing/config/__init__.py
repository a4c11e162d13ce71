"""Stage 1, config.json to a model shape: one reader per architecture family, chosen by what the config
holds, each naming the fields it reads (docs/architecture.md)."""

from .fields import MAX_CONFIG_BYTES, parse_config_text, read_config_file
from .quantization import FORMAT_BY_METHOD, GPTQ_PACKED_METHODS
from .read import resolve_shape
from .shape import DTYPE_BYTES, DTYPE_NAMES, MODEL_DTYPE, ModelShape, with_mtp_layers
from .unread import MEMORY_RELEVANT_FIELDS

__all__ = ["DTYPE_BYTES", "DTYPE_NAMES", "FORMAT_BY_METHOD", "GPTQ_PACKED_METHODS", "MAX_CONFIG_BYTES",
           "MEMORY_RELEVANT_FIELDS", "MODEL_DTYPE", "ModelShape", "parse_config_text", "read_config_file",
           "resolve_shape", "with_mtp_layers"]
